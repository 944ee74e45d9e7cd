#include "runtime/rank_threads.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
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

}  // namespace

void run_rank_threads(const WorldOptions& options, FirstFailure& failures,
                      const std::function<void(int rank)>& run,
                      const std::function<void(int rank, const std::string& reason)>& release) {
  std::mutex mutex;
  std::condition_variable ended;
  int running = 0;
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
        }
        // Note: notified unlocked; `ended` outlives every thread, which are all joined (or the
        // process ends) before this function returns.
        ended.notify_all();
      }));
    } catch (const std::exception& error) {
      {
        std::lock_guard lock(mutex);
        --running;
      }
      failures.offer(rank, error);
      release(rank, error.what());
      break;
    }
  }
  {
    std::unique_lock lock(mutex);
    while (running > 0) {
      if (const auto first = failures.first_at()) {
        const bool interrupted = options.interrupted && options.interrupted();
        if (interrupted || Clock::now() >= *first + options.grace) {
          lock.unlock();
          // Note: never returns. The threads still running use `run`'s state, the caller's, and
          // the streams and buffers of their ranks; none of it may be freed under them.
          end_process(options, *failures.failure());
        }
      }
      ended.wait_for(lock, kPoll);
    }
  }
  for (std::thread& thread : threads) thread.join();
  failures.rethrow();
}

}  // namespace zest::detail
