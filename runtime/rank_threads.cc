#include "runtime/rank_threads.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/process_end.h"
#include "runtime/thread_start.h"

namespace zest::detail {

namespace {

using Clock = FirstFailure::Clock;

// How often the wait looks for a failure and an interruption: an interrupted wait ends within
// this, and a running job pays a wake-up of the main thread this often.
constexpr auto kPoll = std::chrono::milliseconds(50);

// What ends the process when the ranks do not stop within the grace period of an interruption.
Error unheeded_interruption(const WorldOptions& options, const std::vector<bool>& finished) {
  std::string ranks;
  for (std::size_t rank = 0; rank < finished.size(); ++rank) {
    if (!finished[rank]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(rank);
  }
  return Error(ErrorKind::kCommTimeout,
               "interrupted, and rank(s) " + ranks + " had not stopped " +
                   seconds_text(options.grace) +
                   " later (stalled in a step, a wait or an evaluation); ended without them");
}

}  // namespace

void run_rank_threads(const WorldOptions& options, FirstFailure& failures,
                      const std::function<void(int rank)>& run,
                      const std::function<void(int rank, const std::string& reason)>& release) {
  std::mutex mutex;
  std::condition_variable ended;
  int running = 0;
  std::vector<bool> finished(static_cast<std::size_t>(options.ranks), false);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(options.ranks));
  for (int rank = 0; rank < options.ranks; ++rank) {
    try {
      {
        std::lock_guard lock(mutex);
        ++running;
      }
      threads.push_back(start_thread("the rank's thread", [&, rank] {
        try {
          run(rank);
        } catch (const std::exception& error) {
          failures.offer(rank, error);  // `run` catches its own; this is a last resort
        }
        {
          std::lock_guard lock(mutex);
          --running;
          finished[static_cast<std::size_t>(rank)] = true;
        }
        // Note: notified unlocked; `ended` outlives every thread, which are all joined (or the
        // process ends) before this function returns.
        ended.notify_all();
      }));
    } catch (const std::exception& error) {
      {
        std::lock_guard lock(mutex);
        --running;
        finished[static_cast<std::size_t>(rank)] = true;
      }
      failures.offer(rank, error);
      release(rank, error.what());
      break;
    }
  }
  {
    std::unique_lock lock(mutex);
    // Note: a sentinel, not std::optional: GCC 12 at -O1 (the hardening builds) sees the
    // optional's value as maybe uninitialized under -Werror.
    constexpr Clock::time_point kNotInterrupted = Clock::time_point::max();
    Clock::time_point interrupted_at = kNotInterrupted;
    while (running > 0) {
      const bool interrupted = options.interrupted && options.interrupted();
      if (const auto first = failures.first_at()) {
        if (interrupted || Clock::now() >= *first + options.grace) {
          lock.unlock();
          // Note: never returns. The threads still running use `run`'s state, the caller's, and
          // the streams and buffers of their ranks; none of it may be freed under them.
          end_process(options, *failures.failure());
        }
      } else if (interrupted) {
        // Note: the ranks normally stop after the step in progress; one that sleeps, stalls or
        // evaluates on past the grace period would otherwise make the signal wait for it.
        if (interrupted_at == kNotInterrupted) interrupted_at = Clock::now();
        if (Clock::now() >= interrupted_at + options.grace) {
          const Error error = unheeded_interruption(options, finished);
          lock.unlock();
          end_process(options, error, options.interrupted_status ? options.interrupted_status()
                                                                 : exit_status(error));
        }
      } else {
        interrupted_at = kNotInterrupted;  // the caller may hold an interruption back (a save)
      }
      ended.wait_for(lock, kPoll);
    }
  }
  for (std::thread& thread : threads) thread.join();
  failures.rethrow();
}

}  // namespace zest::detail
