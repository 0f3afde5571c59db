// The shape of libvmmipc.so as loaded into foreign processes: it exports
// exactly the hooked names (plus dlsym/dlvsym) and needs nothing beyond the
// C/C++ runtime, so it cannot clash with a host's own fmt or spdlog.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

std::string Output(const std::string& command) {
  std::string out;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
    pclose(pipe);
  }
  return out;
}

std::set<std::string> HookedNames() {
  std::ifstream def(std::string(VMMIPC_SOURCE_DIR) + "/csrc/driver/entry_points.h");
  std::stringstream text;
  text << def.rdbuf();
  std::set<std::string> names;
  std::string s = text.str();
  std::regex hook("\\n\\s*HOOK\\((\\w+),");
  for (auto it = std::sregex_iterator(s.begin(), s.end(), hook); it != std::sregex_iterator(); ++it)
    names.insert((*it)[1]);
  return names;
}

TEST(LibrarySurface, ExportsExactlyTheHookedNames) {
  std::string nm = Output(std::string("nm -D --defined-only ") + VMMIPC_LIBRARY_PATH);
  ASSERT_FALSE(nm.empty()) << "nm failed";
  std::set<std::string> exported;
  std::istringstream lines(nm);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string address, type, name;
    words >> address >> type >> name;
    if (type == "A") continue;  // version nodes
    exported.insert(name.substr(0, name.find('@')));
  }
  std::set<std::string> expected = HookedNames();
  EXPECT_GE(expected.size(), 12u);
  expected.insert("dlsym");
  expected.insert("dlvsym");
  EXPECT_EQ(exported, expected);
  EXPECT_NE(nm.find("dlsym@GLIBC_2.2.5"), std::string::npos);
  EXPECT_NE(nm.find("dlsym@@GLIBC_2.34"), std::string::npos);
}

TEST(LibrarySurface, NeedsOnlyTheCAndCxxRuntime) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizer builds add their runtime";
#endif
  std::string dynamic = Output(std::string("readelf -d ") + VMMIPC_LIBRARY_PATH);
  std::regex needed("NEEDED\\)\\s+Shared library: \\[([^\\]]+)\\]");
  const std::set<std::string> allowed = {"libc.so.6", "libstdc++.so.6", "libgcc_s.so.1",
                                         "libm.so.6", "libdl.so.2",     "libpthread.so.0"};
  int count = 0;
  for (auto it = std::sregex_iterator(dynamic.begin(), dynamic.end(), needed);
       it != std::sregex_iterator(); ++it, ++count)
    EXPECT_TRUE(allowed.count((*it)[1])) << "unexpected NEEDED " << (*it)[1];
  EXPECT_GT(count, 0);
  EXPECT_EQ(dynamic.find("RUNPATH"), std::string::npos);
  EXPECT_EQ(dynamic.find("RPATH"), std::string::npos);
}

TEST(LibrarySurface, NoFmtOrSpdlogSymbolsLeak) {
  std::string all = Output(std::string("nm -D -C ") + VMMIPC_LIBRARY_PATH);
  EXPECT_EQ(all.find("fmt::"), std::string::npos);
  EXPECT_EQ(all.find("spdlog::"), std::string::npos);
}

}  // namespace
