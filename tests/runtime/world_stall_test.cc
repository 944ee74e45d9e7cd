// A World of threads never waits without bound for a rank that cannot finish. When one rank is
// stalled — its host thread asleep in compute, its stream stuck before a collective, a read that
// never returns — the first peer to time out records the failure, naming the collective as its
// caller issued it (the collective-order check on), the step and the timeout; the others get
// WorldOptions::grace to end, and then the World ends the process with that one line and exit
// status 1, without joining the stalled thread. WorldOptions::interrupted ends that wait at
// once. A rank thread that cannot be started is an Error, not std::terminate. Each stall
// scenario ends its process, so it runs in a child: this executable, running one DISABLED_
// scenario below.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "runtime/local_communicator.h"
#include "runtime/thread_start.h"
#include "runtime/world.h"
#include "tests/support/capture_error.h"
#include "tests/support/subprocess.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using zest::testing::capture_error;
using ::testing::Not;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Every scenario: ranks 0 and 2 all-reduce at step 3 with a 1 s timeout; rank 1 stalls first.
WorldOptions scenario_options() {
  WorldOptions options;
  options.ranks = 3;
  options.timeout = milliseconds(1000);
  options.grace = milliseconds(1000);
  options.check_collectives = true;  // the timeout must name the caller's collective anyway
  options.program = "world-stall";
  options.before_exit = [] {
    constexpr char kLine[] = "before_exit ran\n";
    (void)::write(STDOUT_FILENO, kLine, sizeof kLine - 1);
  };
  return options;
}

void run_stalling(const std::function<void(RankContext&)>& stall,
                  const WorldOptions& options = scenario_options()) {
  World(options).run([&](RankContext& context) {
    context.communicator.begin_step(3);
    if (context.rank == 1) stall(context);
    float value = 1.0f;
    context.communicator.label_next("step loss");
    context.communicator.all_reduce(context.comm, &value, &value, 1, DType::kFloat32,
                                    Reduction::kSum);
    context.comm.synchronize();
  });
}

const auto kForever = std::chrono::seconds(1000);

// ---- scenarios (run in a child by the tests below; disabled when ctest runs this suite) ------

TEST(WorldStallScenario, DISABLED_InCompute) {
  run_stalling([](RankContext&) { std::this_thread::sleep_for(kForever); });
}

TEST(WorldStallScenario, DISABLED_InAStream) {
  // The host thread goes on; its comm stream sleeps before the all-reduce it then runs.
  run_stalling([](RankContext& context) {
    context.comm.enqueue([] { std::this_thread::sleep_for(kForever); });
  });
}

TEST(WorldStallScenario, DISABLED_InIo) {
  // A read that never returns: the pipe's write end stays open, and nothing is written.
  run_stalling([](RankContext&) {
    int ends[2];
    ASSERT_EQ(::pipe(ends), 0);
    char byte = 0;
    (void)::read(ends[0], &byte, 1);
  });
}

std::atomic<bool> interrupted{false};

TEST(WorldStallScenario, DISABLED_InterruptedWhileWaiting) {
  // A grace period far longer than the test: only the interruption can end the wait in time.
  WorldOptions options = scenario_options();
  options.grace = std::chrono::seconds(60);
  options.interrupted = [] { return interrupted.load(); };
  std::signal(SIGINT, [](int) { interrupted = true; });
  run_stalling([](RankContext&) { std::this_thread::sleep_for(kForever); }, options);
}

TEST(WorldStallScenario, DISABLED_InterruptedWhileEveryRankSleeps) {
  // No rank fails and none waits for another: only the interruption's grace period ends it.
  WorldOptions options = scenario_options();
  options.interrupted = [] { return interrupted.load(); };
  options.interrupted_status = [] { return 128 + SIGINT; };
  std::signal(SIGINT, [](int) { interrupted = true; });
  World(options).run([](RankContext&) { std::this_thread::sleep_for(kForever); });
}

// ---- tests -----------------------------------------------------------------------------------

struct Child {
  zest::testing::ProcessResult result;
  double seconds = 0.0;
};

// Runs scenario `name` in a child, bounded by 30 s; sends it SIGINT after `signal_after`, if set.
Child run_child(const std::string& name, milliseconds signal_after = milliseconds(0)) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("world_stall_test_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::create_directories(dir);
  const zest::testing::OutputFiles files{(dir / "out").string(), (dir / "err").string()};
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const auto start = Clock::now();
  const pid_t pid = zest::testing::start_program(
      self,
      {"--gtest_also_run_disabled_tests", "--gtest_filter=WorldStallScenario.DISABLED_" + name},
      files);
  if (signal_after.count() > 0) {
    std::this_thread::sleep_for(signal_after);
    ::kill(pid, SIGINT);
  }
  Child child;
  child.result = zest::testing::wait_for_program_within(pid, files, std::chrono::seconds(30));
  child.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::filesystem::remove_all(dir);
  return child;
}

// The one line a stall scenario ends with: a healthy rank's timeout, in the collective rank 0
// and 2 issued (not the order check's gather), at their step.
void expect_the_timeout_line(const Child& child) {
  EXPECT_FALSE(child.result.killed_at_limit) << "still running after 30 s";
  EXPECT_EQ(child.result.status, 1) << child.result.err;
  const std::vector<std::string> lines = zest::testing::lines_of(child.result.err);
  ASSERT_EQ(lines.size(), 1u) << child.result.err;
  EXPECT_THAT(lines[0], MatchesRegex("world-stall: error: rank [02]: all_reduce #0 \\(1 x fp32, "
                                     "sum\\) 'step loss' at step 3 on rank [02]: timed out after "
                                     "1 s waiting for rank\\(s\\) 1; .*"));
  EXPECT_THAT(lines[0], Not(HasSubstr("int32")));  // the order check's record
  EXPECT_THAT(child.result.out, HasSubstr("before_exit ran"));
}

TEST(WorldStall, ARankStalledInComputeEndsTheProcessAfterTheTimeoutAndGrace) {
  const Child child = run_child("InCompute");
  expect_the_timeout_line(child);
  // 1 s timeout + 1 s grace, plus the child's start, on a loaded machine.
  EXPECT_LT(child.seconds, 8.0);
  EXPECT_GT(child.seconds, 1.9);  // not before the grace period
}

TEST(WorldStall, ARankWhoseStreamStallsEndsTheProcessAfterTheTimeoutAndGrace) {
  const Child child = run_child("InAStream");
  expect_the_timeout_line(child);
  EXPECT_LT(child.seconds, 8.0);
}

TEST(WorldStall, ARankStalledInIoEndsTheProcessAfterTheTimeoutAndGrace) {
  const Child child = run_child("InIo");
  expect_the_timeout_line(child);
  EXPECT_LT(child.seconds, 8.0);
}

TEST(WorldStall, AnInterruptionEndsTheWaitForAStalledRankAtOnce) {
  const Child child = run_child("InterruptedWhileWaiting", milliseconds(2500));
  expect_the_timeout_line(child);
  // Signalled at 2.5 s, after the 1 s timeout; the 60 s grace would end it at 61 s.
  EXPECT_LT(child.seconds, 6.0);
}

TEST(WorldStall, AnInterruptionThatNoRankHeedsEndsTheProcessAfterTheGracePeriod) {
  const Child child = run_child("InterruptedWhileEveryRankSleeps", milliseconds(1500));
  EXPECT_FALSE(child.result.killed_at_limit) << "still running after 30 s";
  EXPECT_EQ(child.result.status, 128 + SIGINT) << child.result.err;
  const std::vector<std::string> lines = zest::testing::lines_of(child.result.err);
  ASSERT_EQ(lines.size(), 1u) << child.result.err;
  EXPECT_THAT(lines[0], HasSubstr("world-stall: error: interrupted, and rank(s) 0, 1, 2 had not "
                                  "stopped 1 s later"));
  // Signalled at 1.5 s (after the child's start), 1 s of grace, on a loaded machine.
  EXPECT_LT(child.seconds, 8.0);
  EXPECT_GT(child.seconds, 2.4);  // not before the grace period
}

TEST(WorldStall, ARankThatRecoversWithinTheGracePeriodIsJoined) {
  // The World returns (throws) as before when every rank ends in time: nothing is left running.
  WorldOptions options = scenario_options();
  options.grace = std::chrono::seconds(30);
  const auto start = Clock::now();
  const Error error = capture_error([&] {
    run_stalling([](RankContext&) { std::this_thread::sleep_for(milliseconds(1500)); }, options);
  });
  EXPECT_EQ(error.kind(), ErrorKind::kCommTimeout) << error.what();
  EXPECT_THAT(error.what(), HasSubstr("'step loss' at step 3 on rank "));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
}

// ---- threads that cannot be started ----------------------------------------------------------

TEST(WorldThreads, AThreadThatCannotStartIsAnErrorNamingTheLimitNotTerminate) {
  // The 1st thread is rank 0's; later ones race between the main thread starting ranks and
  // the ranks starting their streams: every one must end as an Error.
  for (long n : {1, 2, 3, 5, 8, 12}) {
    SCOPED_TRACE("thread start " + std::to_string(n) + " fails");
    detail::fail_nth_thread_start(n);
    WorldOptions options;
    options.ranks = 4;
    options.timeout = std::chrono::seconds(30);
    const auto start = Clock::now();
    const Error error = capture_error([&] {
      World(options).run([](RankContext& context) {
        context.communicator.barrier(context.comm);
        context.comm.synchronize();
      });
    });
    detail::fail_nth_thread_start(0);
    EXPECT_EQ(error.kind(), ErrorKind::kDevice) << error.what();
    EXPECT_THAT(error.what(), MatchesRegex("rank [0-3]: cannot start the (rank's thread|thread of "
                                           "stream 'rank [0-3] [a-z]+'): Resource temporarily "
                                           "unavailable \\(.*ulimit -u.*"));
    // The ranks that did start fail at once, not at the 30 s timeout.
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  }
}

// ---- a peer stalled inside a collective --------------------------------------------------------

TEST(LocalGroupStall, APeerStalledInsideACollectiveFailsTheGroupButIsWaitedFor) {
  // Both ranks arrive; rank 1 then stalls before it has finished (in phase two, while it may be
  // reading rank 0's buffers). Rank 0 must not return — its caller would free those buffers —
  // but the group fails at the timeout, so that a World learns of it and ends the process.
  LocalGroup group(2, milliseconds(300));
  std::atomic<long> failed_after_ms{-1};
  std::string failure;
  const auto start = Clock::now();
  group.set_failure_observer([&](int rank, const Error& error) {
    failure = "rank " + std::to_string(rank) + ": " + error.what();
    failed_after_ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
  });
  LocalCall call{"all_gather", 4, DType::kFloat32, Reduction::kSum, 0, nullptr, nullptr,
                 "all_gather #0 (4 x fp32) 'gather block1'", 2};
  std::atomic<long> rank1_left_ms{-1};
  long rank0_left_ms = -1;
  std::thread rank1([&] {
    group.arrive(1, 0, call);
    std::this_thread::sleep_for(milliseconds(1200));
    rank1_left_ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
    group.leave(1, 0);
  });
  group.arrive(0, 0, call);
  group.leave(0, 0);
  rank0_left_ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
  rank1.join();
  EXPECT_GE(rank0_left_ms, rank1_left_ms.load());
  EXPECT_GE(failed_after_ms.load(), 290);
  EXPECT_LT(failed_after_ms.load(), 1100);
  EXPECT_EQ(failure,
            "rank 0: all_gather #0 (4 x fp32) 'gather block1' at step 2 on rank 0: timed out "
            "after 0.3 s waiting for rank(s) 1 to finish it; a rank is stalled (world.timeout_s "
            "sets the limit)");
}

}  // namespace
}  // namespace zest
