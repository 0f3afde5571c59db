// "Follow" (issues 14 and 43): with follow on in every rank (the default), importers follow
// an exporter's memory-saver pause (cuMemUnmap + cuMemRelease, the reservation
// kept: torch_memory_saver, vLLM sleep) and resume (cuMemCreate + cuMemMap at
// the same addresses): a pause frees the importers' mappings too, a resume maps
// the new memory at the importer's old pointer; a gone importer does not delay
// a pause, a stopped one costs it VMMIPC_TIMEOUT_MS and is named; a resume of
// another size is refused; an open closed while paused leaves nothing. With
// VMMIPC_FOLLOW=0 an importer keeps the old memory, as legacy IPC does, and
// the exporter says once who pins how much.
//
// vmmipc_peer's `pause NAME` and `resume NAME [CHUNK_SIZE]` do what
// torch_memory_saver does on an alloc_vmm buffer. The VMMIPC_STATS counters
// are read from each peer's exit report; what the pause frees is read from
// the simulated driver (`stats`), and on a GPU only the fds are compared.
// The graph test runs on a GPU only (the simulator has no graphs).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <regex>
#include <string>
#include <thread>

#include "e2e_layout.h"
#include "logged_peer_test.h"
#include "peer_process.h"

namespace vmmipc::testing {
namespace {

// Whether a warning line of `log` names `pid` (not in its own prefix: after "warning:").
bool WarningNames(const std::string& log, pid_t pid) {
  return std::regex_search(log, std::regex(" warning: [^\n]*\\b" + std::to_string(pid) + "\\b"));
}

class Follow : public LoggedPeerTest {
 protected:
  // A peer with the follow switch on (unless `env` says otherwise) and the
  // VMMIPC_STATS exit report that ExitLog() returns.
  std::unique_ptr<PeerProcess> FollowPeer(const std::string& name, const std::string& rank,
                                          std::map<std::string, std::string> env = {}) {
    env.emplace("VMMIPC_FOLLOW", "1");
    env.emplace("VMMIPC_STATS", "1");
    return Peer(name, rank, env);
  }

  // One buffer of the exporter opened by the importer.
  struct Shared {
    std::string handle;
    Resources baseline;  // the importer's, before this open (its lazy state made)
    std::string ptr;     // the importer's pointer ("" if the open failed)
  };

  // Exports `size` bytes at `base` (filled with `seed`), makes the importer's
  // lazily created state (zone, and with follow on its watch connection to
  // this exporter) with one open and close, takes the importer's baseline, then
  // opens again and checks the bytes.
  Shared Share(PeerProcess& exporter, PeerProcess& importer, uint64_t base, uint64_t size,
               int seed) {
    Shared s;
    s.handle = Handle(exporter, base);
    OpenCheckClose(importer, s.handle, size, seed);
    s.baseline = Held(importer);
    s.ptr = Value(importer.Call("open " + s.handle));
    EXPECT_FALSE(s.ptr.empty());
    if (!s.ptr.empty()) {
      EXPECT_EQ(importer.Call("check " + s.ptr + " " + Hex(size) + " " + std::to_string(seed)),
                "ok");
    }
    return s;
  }

  // An exporter (rank 0) and an importer (rank 1) with follow on, and the
  // exporter's VMM buffer "a" of `chunks` chunks (filled with `seed`) shared
  // between them (Share). Bind it: auto [exporter, importer, base, size, s].
  struct SharedPair {
    std::unique_ptr<PeerProcess> exporter;
    std::unique_ptr<PeerProcess> importer;
    uint64_t base = 0;
    uint64_t size = 0;
    Shared s;
  };
  SharedPair ShareBuffer(int chunks, int seed, std::map<std::string, std::string> exporter_env = {},
                         std::map<std::string, std::string> importer_env = {}) {
    SharedPair pair;
    pair.exporter = FollowPeer("exporter", "0", std::move(exporter_env));
    pair.importer = FollowPeer("importer", "1", std::move(importer_env));
    if (!pair.exporter || !pair.importer) return pair;
    pair.size = static_cast<uint64_t>(chunks) * kChunk;
    pair.base = VmmBuffer(*pair.exporter, "a", chunks, seed);
    pair.s = Share(*pair.exporter, *pair.importer, pair.base, pair.size, seed);
    return pair;
  }

  // `command` in `peer`; its answer in *answer, the milliseconds it took returned.
  static long Timed(PeerProcess& peer, const std::string& command, std::string* answer) {
    const auto start = Clock::now();
    *answer = peer.Call(command);
    return MsSince(start);
  }

  // The exit report of a peer (VMMIPC_STATS=1): its whole log, checked to hold one.
  std::string Report(std::unique_ptr<PeerProcess>* peer) {
    const std::string log = ExitLog(peer);
    EXPECT_NE(log.find("stats at exit:"), std::string::npos) << "no VMMIPC_STATS report";
    return log;
  }

  // A raw follower: vmmipc_peer without the library (raw_follower.h).
  std::unique_ptr<PeerProcess> RawPeer(const std::string& name) {
    return Peer(name, "", {}, {}, /*preload=*/false);
  }

  // `count` one-chunk VMM buffers "a0", "a1", ... of the exporter (its
  // allocations); their names, and their handles in *handles.
  std::vector<std::string> Allocations(PeerProcess& exporter, int count,
                                       std::vector<std::string>* handles) {
    std::vector<std::string> names;
    for (int i = 0; i < count; ++i) {
      names.push_back("a" + std::to_string(i));
      handles->push_back(Handle(exporter, VmmBuffer(exporter, names.back(), 1, i + 1)));
    }
    return names;
  }

  // Pauses every buffer of `names` in turn (one cuMemUnmap each, so one
  // Notify each: a pause of that many allocations), running `between` after
  // each; the milliseconds they took together.
  template <typename Between>
  long PauseEach(PeerProcess& exporter, const std::vector<std::string>& names, Between between) {
    long total = 0;
    for (const std::string& name : names) {
      std::string answer;
      total += Timed(exporter, "pause " + name, &answer);
      EXPECT_EQ(answer, "ok") << name;
      between();
    }
    return total;
  }

  // On the simulated driver, touching memory that is not mapped is refused
  // (the real driver faults): the paused range must not be readable.
  static void ExpectUnmapped(PeerProcess& importer, const std::string& ptr) {
    if (Sim()) {
      EXPECT_TRUE(StartsWith(importer.Call("check " + ptr + " 0x1000 1"), "err "))
          << "the importer can still read its old mapping at " << ptr;
    }
  }
};

TEST_F(Follow, PauseFreesTheImportersMappingAndResumeMapsNewMemoryAtTheSamePointer) {
  auto [exporter, importer, base, size, s] = ShareBuffer(2, 1);
  ASSERT_TRUE(exporter && importer);
  ASSERT_FALSE(s.ptr.empty());
  const std::string range = importer->Call("range " + s.ptr);
  ASSERT_TRUE(StartsWith(range, "ok ")) << range;
  const Resources opened = Held(*importer);
  if (Sim()) {
    ASSERT_GT(opened.allocations, s.baseline.allocations) << opened;
  }

  // Pause: the importer's mapping goes (and with it the memory), its pointer and record stay.
  ASSERT_EQ(exporter->Call("pause a"), "ok");
  EXPECT_EQ(Settled(*importer, s.baseline), s.baseline)
      << "the pause left the importer holding the exporter's old memory";
  EXPECT_EQ(importer->Call("range " + s.ptr), range);
  ExpectUnmapped(*importer, s.ptr);

  // Resume: new memory, mapped at the same pointer, shared both ways.
  ASSERT_EQ(exporter->Call("resume a"), "ok");
  ASSERT_EQ(exporter->Call("fill " + Hex(base) + " " + Hex(size) + " 2"), "ok");
  EXPECT_EQ(importer->Call("check " + s.ptr + " " + Hex(size) + " 2"), "ok")
      << "the importer does not see the resumed memory at its pointer";
  EXPECT_EQ(importer->Call("range " + s.ptr), range);
  if (Sim()) {
    EXPECT_EQ(Settled(*importer, opened), opened);  // what the open held, and no more
  }
  EXPECT_EQ(importer->Call("fill " + s.ptr + " " + Hex(size) + " 3"), "ok");
  EXPECT_EQ(exporter->Call("check " + Hex(base) + " " + Hex(size) + " 3"), "ok");

  EXPECT_EQ(importer->Call("close " + s.ptr), "ok");
  EXPECT_EQ(Settled(*importer, s.baseline), s.baseline);
  EXPECT_EQ(exporter->Call("free_vmm a"), "ok");
  const std::string imported = Report(&importer);
  EXPECT_EQ(StatsCounter(imported, "follow_pauses"), 2u);
  EXPECT_EQ(StatsCounter(imported, "follow_resumes"), 2u);
  EXPECT_EQ(StatsCounter(imported, "follow_resume_refused"), 0u);
  const std::string exported = Report(&exporter);
  EXPECT_GT(StatsCounter(exported, "follow_notices"), 0u);
  EXPECT_EQ(StatsCounter(exported, "follow_unanswered"), 0u);
}

TEST_F(Follow, ANewHandleOfTheResumedMemoryOpensAtTheOldPointer) {
  auto [exporter, importer, base, size, s] = ShareBuffer(2, 4);
  ASSERT_TRUE(exporter && importer);
  ASSERT_FALSE(s.ptr.empty());
  ASSERT_EQ(exporter->Call("pause a"), "ok");
  ASSERT_EQ(exporter->Call("resume a"), "ok");
  ASSERT_EQ(exporter->Call("fill " + Hex(base) + " " + Hex(size) + " 5"), "ok");

  const std::string again = Value(importer->Call("open " + Handle(*exporter, base)));
  ASSERT_FALSE(again.empty());
  EXPECT_EQ(again, s.ptr) << "a new handle of the resumed memory opened elsewhere";
  EXPECT_EQ(importer->Call("check " + again + " " + Hex(size) + " 5"), "ok");
  // Each open needs its close (one pointer twice, or, failing, two pointers).
  EXPECT_EQ(importer->Call("close " + again), "ok");
  EXPECT_EQ(importer->Call("close " + s.ptr), "ok");
  EXPECT_EQ(Settled(*importer, s.baseline), s.baseline);
}

TEST_F(Follow, AGoneImporterDoesNotDelayThePause) {
  auto exporter = FollowPeer("exporter", "0", {{"VMMIPC_TIMEOUT_MS", "3000"}});
  auto gone = FollowPeer("gone", "1");
  auto follower = FollowPeer("follower", "2");
  ASSERT_TRUE(exporter && gone && follower);
  const uint64_t size = 2 * kChunk;
  const uint64_t base = VmmBuffer(*exporter, "a", 2, 6);
  const Shared s = Share(*exporter, *follower, base, size, 6);
  ASSERT_FALSE(s.ptr.empty());
  ASSERT_FALSE(Value(gone->Call("open " + s.handle)).empty());
  gone->Kill();

  std::string answer;
  const long pause_ms = Timed(*exporter, "pause a", &answer);
  EXPECT_EQ(answer, "ok");
  EXPECT_LT(pause_ms, 1500) << "a gone importer delayed the pause (timeout 3000 ms)";
  EXPECT_EQ(Settled(*follower, s.baseline), s.baseline);
  EXPECT_EQ(exporter->Call("resume a"), "ok");
  EXPECT_EQ(exporter->Call("fill " + Hex(base) + " " + Hex(size) + " 7"), "ok");
  EXPECT_EQ(follower->Call("check " + s.ptr + " " + Hex(size) + " 7"), "ok");
  EXPECT_EQ(follower->Call("close " + s.ptr), "ok");

  const std::string followed = Report(&follower);
  EXPECT_EQ(StatsCounter(followed, "follow_pauses"), 2u);
  const std::string exported = Report(&exporter);
  EXPECT_GT(StatsCounter(exported, "follow_notices"), 0u);
  EXPECT_EQ(StatsCounter(exported, "follow_unanswered"), 0u);
}

TEST_F(Follow, AStoppedImporterCostsThePauseTheTimeoutIsNamedAndCatchesUp) {
  // One chunk: one event, so one wait of the timeout and one unanswered importer.
  auto [exporter, importer, base, size, s] = ShareBuffer(1, 8, {{"VMMIPC_TIMEOUT_MS", "1000"}});
  ASSERT_TRUE(exporter && importer);
  ASSERT_FALSE(s.ptr.empty());

  ASSERT_TRUE(StopAndWait(importer->pid()));
  std::string answer;
  const long pause_ms = Timed(*exporter, "pause a", &answer);
  ASSERT_EQ(kill(importer->pid(), SIGCONT), 0);
  EXPECT_EQ(answer, "ok");
  // Bounds, not a performance figure: it waited for the importer, then gave up.
  EXPECT_GE(pause_ms, 800) << "the pause did not wait for the stopped importer";
  EXPECT_LT(pause_ms, 5000);
  const auto start = Clock::now();
  while (!WarningNames(Log(*exporter), importer->pid()) && MsSince(start) < 3000) usleep(10000);
  EXPECT_TRUE(WarningNames(Log(*exporter), importer->pid()))
      << "no warning names the stopped importer, pid " << importer->pid();

  // Running again, the importer handles the pause it missed.
  if (Sim()) {
    Resources now = Settled(*importer, s.baseline);
    for (const auto start = Clock::now(); !(now == s.baseline) && MsSince(start) < 5000;)
      now = Settled(*importer, s.baseline);
    EXPECT_EQ(now, s.baseline) << "the importer did not catch up with the pause";
  }
  // Caught up, it lags until the pause's burst is over (a timeout after it:
  // transport/serve/watch/watchers.h); then the exporter waits for it again.
  EXPECT_TRUE(LogShows(*exporter, "answers again", 5000)) << Log(*exporter);
  // And follows the next resume.
  EXPECT_EQ(exporter->Call("resume a"), "ok");
  EXPECT_EQ(exporter->Call("fill " + Hex(base) + " " + Hex(kChunk) + " 9"), "ok");
  EXPECT_EQ(importer->Call("check " + s.ptr + " " + Hex(kChunk) + " 9"), "ok");
  EXPECT_EQ(importer->Call("close " + s.ptr), "ok");
  EXPECT_EQ(Settled(*importer, s.baseline), s.baseline);

  const std::string imported = Report(&importer);
  EXPECT_EQ(StatsCounter(imported, "follow_pauses"), 1u);
  EXPECT_EQ(StatsCounter(imported, "follow_resumes"), 1u);
  const std::string exported = Report(&exporter);
  EXPECT_EQ(StatsCounter(exported, "follow_unanswered"), 1u);
}

TEST_F(Follow, AResumeOfAnotherSizeIsRefusedAndTheOpenStillClosesCleanly) {
  auto exporter = FollowPeer("exporter", "0");
  auto importer = FollowPeer("importer", "1");
  ASSERT_TRUE(exporter && importer);
  // One chunk, and room after it in the reservation for a resume twice its size.
  const uint64_t base =
      Num(Value(exporter->Call("alloc_vmm a " + Hex(kChunk) + " 1 " + Hex(kChunk))));
  ASSERT_NE(base, 0u);
  ASSERT_EQ(exporter->Call("fill " + Hex(base) + " " + Hex(kChunk) + " 10"), "ok");
  const Shared s = Share(*exporter, *importer, base, kChunk, 10);
  ASSERT_FALSE(s.ptr.empty());
  ASSERT_EQ(exporter->Call("pause a"), "ok");

  const size_t mark = Log(*importer).size();
  EXPECT_EQ(exporter->Call("resume a " + Hex(2 * kChunk)), "ok");
  EXPECT_TRUE(LogShows(*importer, " warning: ", 3000, mark)) << "no warning about the refusal";
  // The exporter's memory works; the importer's range stays unmapped.
  EXPECT_EQ(exporter->Call("fill " + Hex(base) + " " + Hex(2 * kChunk) + " 11"), "ok");
  EXPECT_EQ(exporter->Call("check " + Hex(base) + " " + Hex(2 * kChunk) + " 11"), "ok");
  EXPECT_EQ(Settled(*importer, s.baseline), s.baseline);
  ExpectUnmapped(*importer, s.ptr);
  EXPECT_EQ(importer->Call("close " + s.ptr), "ok");
  EXPECT_EQ(Settled(*importer, s.baseline), s.baseline);
  EXPECT_EQ(importer->Call("pid"), "ok " + std::to_string(importer->pid()));

  const std::string imported = Report(&importer);
  EXPECT_EQ(StatsCounter(imported, "follow_resume_refused"), 1u);
  EXPECT_EQ(StatsCounter(imported, "follow_resumes"), 0u);
  EXPECT_EQ(StatsCounter(imported, "follow_pauses"), 1u);
}

TEST_F(Follow, ClosingWhilePausedReleasesEverythingAndTheLaterResumeIsIgnored) {
  auto [exporter, importer, base, size, s] = ShareBuffer(2, 12, {{"VMMIPC_TIMEOUT_MS", "3000"}});
  ASSERT_TRUE(exporter && importer);
  ASSERT_FALSE(s.ptr.empty());
  ASSERT_EQ(exporter->Call("pause a"), "ok");
  EXPECT_EQ(importer->Call("close " + s.ptr), "ok");
  EXPECT_EQ(Settled(*importer, s.baseline), s.baseline);

  std::string answer;
  const long resume_ms = Timed(*exporter, "resume a", &answer);
  EXPECT_EQ(answer, "ok");
  EXPECT_LT(resume_ms, 1500) << "the resume waited for an importer that had closed";
  EXPECT_EQ(exporter->Call("fill " + Hex(base) + " " + Hex(size) + " 13"), "ok");
  EXPECT_EQ(Settled(*importer, s.baseline), s.baseline);
  EXPECT_EQ(importer->Call("close " + s.ptr).substr(0, 6), "err 1 ");

  const std::string imported = Report(&importer);
  EXPECT_EQ(StatsCounter(imported, "follow_pauses"), 2u);
  EXPECT_EQ(StatsCounter(imported, "follow_resumes"), 0u);
  EXPECT_EQ(StatsCounter(imported, "follow_resume_refused"), 0u);
  const std::string exported = Report(&exporter);
  EXPECT_EQ(StatsCounter(exported, "follow_unanswered"), 0u);
}

// A pause of many chunks (one cuMemUnmap, so one notice, per chunk) with a
// stopped importer: the first notice waits the timeout, the rest do not
// wait at all (issue 24: it took the timeout per chunk, 33 minutes for 400
// chunks at the default). Running again, the importer gets what it missed
// (pauses, then the resume) and reads the new memory at its old pointer.
TEST_F(Follow, AStoppedImporterCostsAPauseOfManyChunksOneTimeoutAndCatchesUp) {
  constexpr int kChunks = 48;
  auto [exporter, importer, base, size, s] =
      ShareBuffer(kChunks, 8, {{"VMMIPC_TIMEOUT_MS", "300"}});
  ASSERT_TRUE(exporter && importer);
  ASSERT_FALSE(s.ptr.empty());

  ASSERT_TRUE(StopAndWait(importer->pid()));
  std::string answer;
  const long pause_ms = Timed(*exporter, "pause a", &answer);
  EXPECT_EQ(answer, "ok");
  // Bounds, not a performance figure: one wait of the timeout, not 48.
  EXPECT_GE(pause_ms, 250) << "the pause did not wait for the stopped importer";
  EXPECT_LT(pause_ms, 3000) << "the pause waited for the stopped importer more than once";
  // And the resume while it is still stopped does not wait either.
  const long resume_ms = Timed(*exporter, "resume a", &answer);
  EXPECT_EQ(answer, "ok");
  EXPECT_LT(resume_ms, 3000);
  EXPECT_EQ(exporter->Call("fill " + Hex(base) + " " + Hex(size) + " 9"), "ok");
  ASSERT_EQ(kill(importer->pid(), SIGCONT), 0);

  // It catches up by itself (the exporter's listener notices its acks).
  std::string checked;
  for (const auto start = Clock::now(); MsSince(start) < 10000; usleep(20000)) {
    checked = importer->Call("check " + s.ptr + " " + Hex(size) + " 9");
    if (checked == "ok") break;
  }
  EXPECT_EQ(checked, "ok") << "the importer did not catch up with the resume";
  const std::string log = Log(*exporter);
  EXPECT_TRUE(WarningNames(log, importer->pid())) << "no warning names the stopped importer";
  // Its lag ends once the burst of the pause and the resume is over, a
  // timeout after the resume (transport/serve/watch/watchers.h): logged then.
  EXPECT_TRUE(LogShows(*exporter, "answers again", 5000)) << log;
  EXPECT_EQ(importer->Call("close " + s.ptr), "ok");
  EXPECT_EQ(Settled(*importer, s.baseline), s.baseline);

  const std::string imported = Report(&importer);
  EXPECT_EQ(StatsCounter(imported, "follow_pauses"), static_cast<uint64_t>(kChunks));
  EXPECT_EQ(StatsCounter(imported, "follow_resumes"), static_cast<uint64_t>(kChunks));
  const std::string exported = Report(&exporter);
  EXPECT_EQ(StatsCounter(exported, "follow_unanswered"), 1u) << "named more than once";
}

// Issue 36 item 3: the wait for a follower is bounded per pause (per burst
// of Notifies), not per allocation, whatever the follower does. Each pause
// of 20 allocations at VMMIPC_TIMEOUT_MS=500 must take about one timeout;
// before, a follower that answered each event after its deadline was waited
// for again at the next allocation (its answer ended its lag), and one
// process with a follower id per allocation was waited for once per id:
// 20 timeouts, 10 s. Each prints what it measured against its bound.
constexpr int kBurstAllocations = 20;
constexpr int kBurstTimeoutMs = 500;
// One timeout and the commands' own time, loose for a loaded machine; 20
// timeouts are 10,000 ms.
constexpr long kBurstBoundMs = kBurstTimeoutMs + 1500;

// One raw follower (its id 0x5eed) holds every allocation of `handles`: its
// watch connection in `mode` (held, silent) for the first, plain fetches for
// the rest.
void FollowEveryOne(PeerProcess& raw, const std::vector<std::string>& handles,
                    const std::string& mode) {
  ASSERT_TRUE(StartsWith(raw.Call("raw_watch " + handles[0] + " 0x5eed " + mode), "ok "));
  for (size_t i = 1; i < handles.size(); ++i)
    ASSERT_EQ(raw.Call("raw_fetch " + handles[i] + " 0x5eed"), "ok 1");
}

// A pause of the burst's allocations took `pause_ms`: about one timeout,
// never one per allocation (printed with its bound).
void ExpectOneTimeout(long pause_ms, const std::string& follower, const std::string& waited) {
  std::cout << "a pause of " << kBurstAllocations << " allocations with " << follower << " took "
            << pause_ms << " ms (bound " << kBurstBoundMs << " ms; timeout " << kBurstTimeoutMs
            << " ms)\n";
  EXPECT_GE(pause_ms, kBurstTimeoutMs * 8 / 10) << "the pause did not wait for " << waited;
  EXPECT_LT(pause_ms, kBurstBoundMs) << waited << " was waited for more than once";
}

// A follower that answers every event, but only after the exporter stopped
// waiting for it (raw_ack between the allocations: deterministic, no sleep).
TEST_F(Follow, AFollowerThatAnswersEachEventLateCostsAPauseOneTimeout) {
  auto exporter =
      FollowPeer("exporter", "0", {{"VMMIPC_TIMEOUT_MS", std::to_string(kBurstTimeoutMs)}});
  auto raw = RawPeer("raw");
  ASSERT_TRUE(exporter && raw);
  std::vector<std::string> handles;
  const std::vector<std::string> names = Allocations(*exporter, kBurstAllocations, &handles);
  FollowEveryOne(*raw, handles, "held");
  if (HasFatalFailure()) return;
  const long pause_ms = PauseEach(*exporter, names, [&] {
    EXPECT_TRUE(StartsWith(raw->Call("raw_ack"), "ok "));  // answers, late
  });
  ExpectOneTimeout(pause_ms, "a follower that answers late", "the follower");
  // It still follows: every pause reaches it, as catch-up once the burst is over.
  std::string events;
  EXPECT_TRUE(WaitUntil(
      [&] {
        raw->Call("raw_ack");
        events = raw->Call("raw_events");
        size_t pauses = 0;
        for (size_t at = events.find(" pause:"); at != std::string::npos;
             at = events.find(" pause:", at + 1))
          ++pauses;
        return pauses == kBurstAllocations;
      },
      10000))
      << events;
  const std::string exported = Report(&exporter);
  EXPECT_EQ(StatsCounter(exported, "follow_unanswered"), 1u) << "named more than once";
}

// A watcher that sends its watch request and then nothing at all.
TEST_F(Follow, ASilentWatcherCostsAPauseOfManyChunksOneTimeout) {
  auto exporter =
      FollowPeer("exporter", "0", {{"VMMIPC_TIMEOUT_MS", std::to_string(kBurstTimeoutMs)}});
  auto raw = RawPeer("raw");
  ASSERT_TRUE(exporter && raw);
  std::vector<std::string> handles;
  const std::vector<std::string> names = Allocations(*exporter, kBurstAllocations, &handles);
  FollowEveryOne(*raw, handles, "silent");
  if (HasFatalFailure()) return;
  const long pause_ms = PauseEach(*exporter, names, [] {});
  ExpectOneTimeout(pause_ms, "a silent watcher", "the watcher");
}

// One process, a silent watcher under a follower id of its own per allocation.
TEST_F(Follow, OneProcessWithAFollowerIdPerAllocationCostsAPauseOneTimeout) {
  auto exporter =
      FollowPeer("exporter", "0", {{"VMMIPC_TIMEOUT_MS", std::to_string(kBurstTimeoutMs)}});
  auto raw = RawPeer("raw");
  ASSERT_TRUE(exporter && raw);
  std::vector<std::string> handles;
  const std::vector<std::string> names = Allocations(*exporter, kBurstAllocations, &handles);
  // Each granted; as many watch connections kept as the exporter allows one process.
  for (size_t i = 0; i < handles.size(); ++i)
    ASSERT_EQ(raw->Call("raw_watches " + handles[i] + " " + std::to_string(0x6000 + i) + " 1"),
              "ok 1");

  const long pause_ms = PauseEach(*exporter, names, [] {});
  ExpectOneTimeout(pause_ms,
                   "one process's " + std::to_string(kBurstAllocations) + " silent follower ids",
                   "the process");
}

// Issue 36 item 6: follower ids are 32-bit and random, so two importers may
// draw the same one (or one may guess another's). A watch request under a
// follower id that another process watches with must not replace that
// watch (before, the first importer's connection was closed, silently, and
// it followed nothing more): a follower id is bound to the process that
// first watched with it, and the second is answered without a watch.
TEST_F(Follow, AFollowerIdOfAnotherProcessDoesNotTakeItsWatch) {
  auto exporter = FollowPeer("exporter", "0");
  auto first = RawPeer("first");
  auto second = RawPeer("second");
  ASSERT_TRUE(exporter && first && second);
  const uint64_t base = VmmBuffer(*exporter, "a", 1, 1);
  const std::string handle = Handle(*exporter, base);
  ASSERT_TRUE(StartsWith(first->Call("raw_watch " + handle + " 0x5eed"), "ok 1 "));

  // Granted, but without a watch connection: the exporter closes its end
  // after the reply, and says why.
  EXPECT_TRUE(StartsWith(second->Call("raw_watch " + handle + " 0x5eed"), "ok 1 "));
  EXPECT_TRUE(
      LogShows(*exporter, "is the watch of another importer, pid " + std::to_string(first->pid())))
      << Log(*exporter);
  EXPECT_TRUE(WaitUntil([&] { return second->Call("raw_events") == "ok closed"; }))
      << "the second importer's watch was kept: " << second->Call("raw_events");
  ASSERT_EQ(exporter->Call("pause a"), "ok");
  std::string events;
  EXPECT_TRUE(WaitUntil([&] { return (events = first->Call("raw_events")) != "ok"; }))
      << "the first importer heard nothing of the pause";
  EXPECT_TRUE(std::regex_match(events, std::regex("ok pause:" + Hex(base) + ":[0-9]+:0")))
      << "its watch connection was taken: " << events;
}

// An open whose fetch is done but which has not placed its chunks yet (it
// waits for its slot's placement lock, held here by another open whose
// import the simulator delays) when the exporter pauses the chunk: it must
// not map the released memory, and must follow the resume (issue 24: the
// importer answered "not held" and mapped the old memory for good).
TEST_F(Follow, AnOpenInFlightDuringAPauseFollowsItAndTheResume) {
  if (!Sim()) GTEST_SKIP() << "needs the simulator's delayed import";
  auto exporter = FollowPeer("exporter", "0", {{"VMMIPC_LOG_LEVEL", "debug"}});
  auto importer = FollowPeer("importer", "1");
  ASSERT_TRUE(exporter && importer);
  const uint64_t a = VmmBuffer(*exporter, "a", 1, 3);
  const uint64_t b = VmmBuffer(*exporter, "b", 1, 4);
  const uint64_t c = VmmBuffer(*exporter, "c", 1, 5);
  const std::string ha = Handle(*exporter, a), hb = Handle(*exporter, b), hc = Handle(*exporter, c);
  // The watch connection, and nothing left open.
  OpenCheckClose(*importer, hc, kChunk, 5);
  const Resources baseline = Held(*importer);
  auto served = [&](uint64_t address) {
    const std::string line = "served " + Hex(address) + " to pid";
    for (const auto start = Clock::now(); MsSince(start) < 5000; usleep(2000))
      if (Log(*exporter).find(line) != std::string::npos) return true;
    return false;
  };
  ASSERT_EQ(importer->Call("inject_delay cuMemImportFromShareableHandle 1 1500"), "ok");
  ASSERT_EQ(importer->Call("open_bg " + hb + " b"), "ok");  // holds the slot's placement lock
  ASSERT_TRUE(served(b));
  ASSERT_EQ(importer->Call("open_bg " + ha + " a"), "ok");  // fetched, waits for the lock
  ASSERT_TRUE(served(a));
  EXPECT_EQ(exporter->Call("pause a"), "ok");
  const std::string pa = Value(importer->Call("open_bg_result a"));
  const std::string pb = Value(importer->Call("open_bg_result b"));
  ASSERT_FALSE(pa.empty());
  ASSERT_FALSE(pb.empty());
  ExpectUnmapped(*importer, pa);
  EXPECT_EQ(exporter->Call("resume a"), "ok");
  EXPECT_EQ(exporter->Call("fill " + Hex(a) + " " + Hex(kChunk) + " 9"), "ok");
  EXPECT_EQ(importer->Call("check " + pa + " " + Hex(kChunk) + " 9"), "ok")
      << "the open in flight kept the memory the pause released";
  EXPECT_EQ(importer->Call("check " + pb + " " + Hex(kChunk) + " 4"), "ok");
  EXPECT_EQ(importer->Call("close " + pa), "ok");
  EXPECT_EQ(importer->Call("close " + pb), "ok");
  EXPECT_EQ(Settled(*importer, baseline), baseline);
}

// An open that has taken its log of events and is mapping (its import
// delayed by the simulator, under its slot's placement lock) when the
// exporter pauses the chunk: the follow thread waits for that lock and
// unmaps what the open recorded. Before, the event found neither the open
// (no longer in flight) nor its record (not yet made), was acked "not
// held", and the open mapped the released memory for good.
TEST_F(Follow, APauseWhileAnOpenMapsIsFollowedOnceTheOpenRecorded) {
  if (!Sim()) GTEST_SKIP() << "needs the simulator's delayed import";
  auto exporter = FollowPeer("exporter", "0", {{"VMMIPC_LOG_LEVEL", "debug"}});
  auto importer = FollowPeer("importer", "1");
  ASSERT_TRUE(exporter && importer);
  const uint64_t a = VmmBuffer(*exporter, "a", 1, 3);
  const uint64_t c = VmmBuffer(*exporter, "c", 1, 5);
  const std::string ha = Handle(*exporter, a), hc = Handle(*exporter, c);
  OpenCheckClose(*importer, hc, kChunk, 5);  // the watch connection, nothing left open
  const Resources baseline = Held(*importer);
  const int sleeping = SleepingThreads(importer->pid());
  ASSERT_EQ(importer->Call("inject_delay cuMemImportFromShareableHandle 1 1500"), "ok");
  ASSERT_EQ(importer->Call("open_bg " + ha + " a"), "ok");
  // In its delayed import: past its log, before its record.
  ASSERT_TRUE(WaitUntil([&] { return SleepingThreads(importer->pid()) > sleeping; }, 5000));
  EXPECT_EQ(exporter->Call("pause a"), "ok");
  const std::string pa = Value(importer->Call("open_bg_result a"));
  ASSERT_FALSE(pa.empty());
  ExpectUnmapped(*importer, pa);
  EXPECT_EQ(exporter->Call("resume a"), "ok");
  EXPECT_EQ(exporter->Call("fill " + Hex(a) + " " + Hex(kChunk) + " 9"), "ok");
  EXPECT_EQ(importer->Call("check " + pa + " " + Hex(kChunk) + " 9"), "ok")
      << "the open kept the memory the pause released";
  EXPECT_EQ(importer->Call("close " + pa), "ok");
  EXPECT_EQ(Settled(*importer, baseline), baseline);
}

// Issue 43: a memory saver's peers are right with no setting at all. Three
// cycles of pause, resume and write, as torch_memory_saver makes them: every
// pause frees what the importer mapped, and after every resume the importer
// reads and writes the new memory at its old pointer. Nothing warns.
TEST_F(Follow, WithDefaultSettingsAMemorySaversImporterIsRightAfterEveryResume) {
  auto [exporter, importer, base, size, s] =
      ShareBuffer(2, 30, {{"VMMIPC_FOLLOW", kUnset}}, {{"VMMIPC_FOLLOW", kUnset}});
  ASSERT_TRUE(exporter && importer);
  ASSERT_FALSE(s.ptr.empty());
  const Resources opened = Held(*importer);
  for (int cycle = 0; cycle < 3; ++cycle) {
    SCOPED_TRACE("cycle " + std::to_string(cycle));
    ASSERT_EQ(exporter->Call("pause a"), "ok");
    EXPECT_EQ(Settled(*importer, s.baseline), s.baseline) << "the pause freed nothing here";
    ExpectUnmapped(*importer, s.ptr);
    ASSERT_EQ(exporter->Call("resume a"), "ok");
    const std::string seed = std::to_string(31 + 2 * cycle);
    ASSERT_EQ(exporter->Call("fill " + Hex(base) + " " + Hex(size) + " " + seed), "ok");
    EXPECT_EQ(importer->Call("check " + s.ptr + " " + Hex(size) + " " + seed), "ok")
        << "the importer reads an old generation";
    const std::string back = std::to_string(32 + 2 * cycle);
    EXPECT_EQ(importer->Call("fill " + s.ptr + " " + Hex(size) + " " + back), "ok");
    EXPECT_EQ(exporter->Call("check " + Hex(base) + " " + Hex(size) + " " + back), "ok");
    if (Sim()) {
      EXPECT_EQ(Settled(*importer, opened), opened);
    }
  }
  EXPECT_EQ(importer->Call("close " + s.ptr), "ok");
  EXPECT_EQ(Settled(*importer, s.baseline), s.baseline);
  const std::string exported = Report(&exporter);
  EXPECT_EQ(exported.find(" warning: "), std::string::npos) << exported;
  EXPECT_EQ(StatsCounter(exported, "unfollowed_unmaps"), 0u);
  EXPECT_EQ(StatsCounter(Report(&importer), "follow_resumes"), 6u);  // 2 chunks x 3
}

// Legacy semantics, chosen: with VMMIPC_FOLLOW=0 in the importer, it keeps
// the old memory alive. The exporter (following by default) says so once, at
// warning level, at its first unmap of what that importer was granted: which
// pid, how many bytes stay pinned, what to set; VMMIPC_STATS counts each such
// unmap. Likewise when the exporter is the one with follow off.
TEST_F(Follow, WithFollowOffTheImporterKeepsTheOldMemoryAndTheExporterSaysSoOnce) {
  for (const bool off_in_exporter : {false, true}) {
    SCOPED_TRACE(off_in_exporter ? "VMMIPC_FOLLOW=0 in the exporter"
                                 : "VMMIPC_FOLLOW=0 in the importer");
    std::map<std::string, std::string> off = {{"VMMIPC_FOLLOW", "0"}};
    std::map<std::string, std::string> unset = {{"VMMIPC_FOLLOW", kUnset}};
    auto [exporter, importer, base, size, s] =
        ShareBuffer(2, 40, off_in_exporter ? off : unset, off_in_exporter ? unset : off);
    ASSERT_TRUE(exporter && importer);
    ASSERT_FALSE(s.ptr.empty());
    const Resources opened = Held(*importer);
    for (int cycle = 0; cycle < 2; ++cycle) {
      ASSERT_EQ(exporter->Call("pause a"), "ok");
      EXPECT_EQ(Held(*importer), opened) << "the importer let go of the old memory";
      ASSERT_EQ(exporter->Call("resume a"), "ok");
    }
    ASSERT_EQ(exporter->Call("fill " + Hex(base) + " " + Hex(size) + " 41"), "ok");
    EXPECT_EQ(importer->Call("check " + s.ptr + " " + Hex(size) + " 40"), "ok");
    EXPECT_EQ(importer->Call("close " + s.ptr), "ok");
    const pid_t importer_pid = importer->pid();
    const std::string exported = Report(&exporter);
    EXPECT_TRUE(WarningNames(exported, importer_pid)) << exported;
    EXPECT_NE(exported.find(off_in_exporter ? "remove VMMIPC_FOLLOW=0 here"
                                            : "remove VMMIPC_FOLLOW=0 there"),
              std::string::npos)
        << exported;
    // The pause unmaps chunk by chunk: the first unmap, of one chunk, says it.
    EXPECT_NE(exported.find("at least 2 MiB stay pinned"), std::string::npos) << exported;
    size_t warnings = 0;
    for (size_t at = exported.find("were granted to"); at != std::string::npos;
         at = exported.find("were granted to", at + 1))
      ++warnings;
    EXPECT_EQ(warnings, 1u) << "said more than once";
    // The first cycle's pause unmapped the 2 chunks granted; what the
    // resume mapped was granted to nobody, so the second pause says nothing.
    EXPECT_EQ(StatsCounter(exported, "unfollowed_unmaps"), 2u);
    EXPECT_EQ(StatsCounter(exported, "unfollowed_bytes"), 2 * kChunk);
  }
}

// Follow off in both: nothing follows, the importer keeps the old memory alive.
TEST_F(Follow, WithFollowOffTheImporterKeepsTheOldMemory) {
  auto [exporter, importer, base, size, s] =
      ShareBuffer(2, 14, {{"VMMIPC_FOLLOW", "0"}}, {{"VMMIPC_FOLLOW", "0"}});
  ASSERT_TRUE(exporter && importer);
  ASSERT_FALSE(s.ptr.empty());
  const Resources opened = Held(*importer);

  ASSERT_EQ(exporter->Call("pause a"), "ok");
  EXPECT_EQ(Held(*importer), opened) << "the importer let go of the old memory";
  ASSERT_EQ(exporter->Call("resume a"), "ok");
  ASSERT_EQ(exporter->Call("fill " + Hex(base) + " " + Hex(size) + " 15"), "ok");
  // Old bytes at the importer's pointer, and the two sides no longer share.
  EXPECT_EQ(importer->Call("check " + s.ptr + " " + Hex(size) + " 14"), "ok");
  EXPECT_EQ(importer->Call("fill " + s.ptr + " " + Hex(size) + " 16"), "ok");
  EXPECT_EQ(exporter->Call("check " + Hex(base) + " " + Hex(size) + " 15"), "ok");
  EXPECT_EQ(Held(*importer), opened);
  EXPECT_EQ(importer->Call("close " + s.ptr), "ok");
  EXPECT_EQ(Settled(*importer, s.baseline), s.baseline);

  for (auto* peer : {&importer, &exporter}) {
    const std::string log = Report(peer);
    for (const char* counter : {"follow_pauses", "follow_resumes", "follow_resume_refused",
                                "follow_notices", "follow_unanswered"})
      EXPECT_EQ(StatsCounter(log, counter), 0u) << counter;
  }
}

TEST_F(Follow, AGraphCapturedBeforeThePauseReplaysOnTheResumedMemory) {
  if (Sim()) GTEST_SKIP() << "GPU only: the simulated driver has no graphs";
  auto [exporter, importer, base, size, s] = ShareBuffer(2, 17);
  ASSERT_TRUE(exporter && importer);
  ASSERT_FALSE(s.ptr.empty());
  // The graph copies the peer memory into the importer's own buffer.
  const uint64_t local = VmmBuffer(*importer, "local", 2, 18);
  ASSERT_EQ(importer->Call("graph_capture g " + Hex(local) + " " + s.ptr + " " + Hex(size)), "ok");
  ASSERT_EQ(importer->Call("graph_launch g"), "ok");
  EXPECT_EQ(importer->Call("check " + Hex(local) + " " + Hex(size) + " 17"), "ok");

  ASSERT_EQ(exporter->Call("pause a"), "ok");
  ASSERT_EQ(exporter->Call("resume a"), "ok");
  ASSERT_EQ(exporter->Call("fill " + Hex(base) + " " + Hex(size) + " 19"), "ok");
  EXPECT_EQ(importer->Call("graph_launch g"), "ok");
  EXPECT_EQ(importer->Call("check " + Hex(local) + " " + Hex(size) + " 19"), "ok")
      << "the replayed graph did not read the resumed memory";
  EXPECT_EQ(importer->Call("close " + s.ptr), "ok");
}

// An importer that exits while its follow thread maps a resumed chunk
// waits for the map (the exit gate, common/exit_gate.h): the simulator's
// teardown at exit, like the driver's, crashes the process (status 139, a
// line on stderr) if a call is still in progress then. The simulator holds
// the importer's map of the resumed memory; the importer exits meanwhile,
// and the exporter's resume still ends.
TEST_F(Follow, AnImporterThatExitsDuringAResumesMapWaitsForTheMap) {
  if (!Sim()) GTEST_SKIP() << "needs the simulator's delayed map and its teardown";
  auto [exporter, importer, base, size, s] = ShareBuffer(1, 1);
  ASSERT_TRUE(exporter && importer);
  ASSERT_FALSE(s.ptr.empty());
  ASSERT_EQ(exporter->Call("pause a"), "ok");
  EXPECT_EQ(Settled(*importer, s.baseline), s.baseline);
  const int sleeping = SleepingThreads(importer->pid());
  ASSERT_EQ(importer->Call("inject_delay cuMemMap 1 1500"), "ok");
  std::string resumed;
  std::thread resume([&] { resumed = exporter->Call("resume a", 30000); });
  const bool mapping = WaitUntil([&] { return SleepingThreads(importer->pid()) > sleeping; }, 5000);
  EXPECT_EQ(importer->Call("exit_now 0", 30000), "");  // no answer: it has exited
  importer->Kill();                                    // only reaps it
  resume.join();
  ASSERT_TRUE(mapping) << "the follow thread's map did not start";
  const std::string log = ExitLog(&importer);
  EXPECT_EQ(log.find("simcuda: torn down at exit"), std::string::npos)
      << "the exit did not wait for the follow thread's map:\n"
      << log;
  EXPECT_EQ(resumed, "ok");
}

}  // namespace
}  // namespace vmmipc::testing
