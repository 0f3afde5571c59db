// LoadedLibraryProbe: finds a loaded object by a part of its path, and sees a
// library loaded after it first looked (its cache follows the loader's counts).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include "common/loaded_library.h"

namespace vmmipc {
namespace {

TEST(LoadedLibraryProbe, FindsWhatIsLoadedAndNothingElse) {
  LoadedLibraryProbe libc("libc.so");
  EXPECT_TRUE(libc.Loaded());
  EXPECT_TRUE(libc.Loaded());  // from what it kept
  LoadedLibraryProbe none("libvmmipc-no-such-library");
  EXPECT_FALSE(none.Loaded());
  EXPECT_FALSE(none.Loaded());
}

TEST(LoadedLibraryProbe, SeesALibraryLoadedAfterItLookedAndUnloadedAgain) {
  LoadedLibraryProbe uct("libuct_cuda");
  ASSERT_FALSE(uct.Loaded());
  void* library = dlopen(VMMIPC_UCT_CUDA_STANDIN_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(library, nullptr) << dlerror();
  EXPECT_TRUE(uct.Loaded());
  ASSERT_EQ(dlclose(library), 0);
  EXPECT_FALSE(uct.Loaded());
}

}  // namespace
}  // namespace vmmipc
