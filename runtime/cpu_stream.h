// The CPU device's stream: one worker thread draining a queue of closures, and its event, a
// fence with a sequence number. Used through the Stream and Event interfaces.
//
// Stream-ordered frees (runtime/release_after.h) normally run when the worker reaches them, so
// how much memory is live when the host allocates depends on how far the streams have got: on
// a loaded machine, less. With FreeTiming::kWhenWaited (debug, the plan's tests) the worker
// parks each free instead, and a free runs only when a wait proves the stream passed it: the
// host's Event::synchronize or Stream::synchronize, or a stream's wait that the host then
// proves in turn (the waiting stream adopts the frees). That is the order the planner replays
// (planner/peak_plan.h), so the measured peaks equal the plan however the threads are
// scheduled. All other work runs as usual.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "runtime/stream.h"

namespace zest::cpu {

enum class FreeTiming {
  kWhenReached,  // a stream-ordered free runs when the worker gets to it (the default)
  kWhenWaited,   // parked until a wait proves the stream passed it (debug, tests of the plan)
};

// A parked free, run once by whichever wait proves it first.
class ParkedFree {
 public:
  explicit ParkedFree(std::function<void()> free) : free_(std::move(free)) {}
  void run();
  bool done() const { return done_.load(); }

 private:
  std::atomic<bool> done_{false};
  std::function<void()> free_;  // destroyed with the last holder if never run: freed then
};

// The frees a stream holds, each with a task number on that stream: its own, parked as the worker
// reaches them, and those it adopted from streams it waited for (a copy: the recording stream's
// own waits prove them too). Shared with the stream's events, so a wait can reach them after the
// stream has gone.
class ParkedFrees {
 public:
  // A free held already keeps its earlier task number (adoptions go back and forth between
  // streams that wait for each other; each free is held once).
  void park(std::uint64_t task, std::shared_ptr<ParkedFree> free);
  // Removes and returns the frees held at task numbers up to `task`.
  std::vector<std::shared_ptr<ParkedFree>> take_through(std::uint64_t task);
  // The same, not yet run, left in place (a stream adopting them).
  std::vector<std::shared_ptr<ParkedFree>> copy_through(std::uint64_t task);

 private:
  std::mutex mutex_;
  std::vector<std::pair<std::uint64_t, std::shared_ptr<ParkedFree>>> parked_;
  std::unordered_set<const ParkedFree*> held_;  // the frees in parked_
};

class CpuEvent final : public Event {
 public:
  void synchronize() override;

 private:
  friend class CpuStream;

  // Called on the recording stream's worker when the work before record number `sequence`
  // has run; `failure` is empty unless that stream had failed.
  void complete(std::uint64_t sequence, const std::string& failure);
  // Blocks until record number `sequence` has completed; throws if its stream had failed. Then
  // the frees that record proves, parked on a kWhenWaited stream, run here (`adopter` null: the
  // host waited) or move to `adopter` at task `adopter_task` (a stream waited).
  void wait_for(std::uint64_t sequence, ParkedFrees* adopter = nullptr,
                std::uint64_t adopter_task = 0);

  struct RecordPlace {
    std::uint64_t sequence;
    std::shared_ptr<ParkedFrees> parked;  // the recording stream's
    std::uint64_t task;                   // the record's task number on that stream
  };
  // Places are dropped once the host has waited at or after them (a stream's wait proves them
  // only to whoever proves that stream). An event recorded again and again without a host wait
  // (a debug run of many steps) keeps only the newest: a wait on an older record would then
  // prove no frees, and the measured peak would read high.
  static constexpr std::size_t kPlacesKept = 4096;

  std::mutex mutex_;
  std::deque<RecordPlace> places_;  // records on kWhenWaited streams, the newest last
  std::condition_variable completed_cv_;
  std::uint64_t recorded_ = 0;   // how many times record() was called
  std::uint64_t completed_ = 0;  // the last record() whose preceding work has run
  std::string failure_;
};

class CpuStream final : public Stream {
 public:
  explicit CpuStream(std::string name, FreeTiming frees = FreeTiming::kWhenReached);
  ~CpuStream() override;  // drains the queue, then joins the worker; never throws

  CpuStream(const CpuStream&) = delete;
  CpuStream& operator=(const CpuStream&) = delete;

  const std::string& name() const override { return name_; }
  DeviceKind device_kind() const override { return DeviceKind::kCpu; }
  void enqueue(std::function<void()> work) override;
  void record(Event& event) override;
  void wait(Event& event) override;
  void synchronize() override;

  // A stream-ordered free (release_after): runs when the worker reaches it, or with
  // FreeTiming::kWhenWaited once a wait proves the stream passed it.
  void enqueue_free(std::function<void()> free);

 private:
  struct Task {
    std::function<void()> work;
    bool runs_after_failure = false;  // event completions must run, or waiters would hang
    bool parks = false;               // a free to park (kWhenWaited), not to run
    std::uint64_t number = 0;         // set by push(): 1, 2, ... in enqueue order
  };

  // Appends the task; returns its number.
  std::uint64_t push(Task task);
  void run_parked_through(std::uint64_t task);
  void run_worker();
  void rethrow_failure_locked() const;

  const std::string name_;
  std::mutex mutex_;
  std::condition_variable queue_cv_;  // signals the worker: a task arrived or stop
  std::condition_variable idle_cv_;   // signals synchronize(): the queue drained
  std::deque<Task> queue_;
  bool busy_ = false;
  std::uint64_t pushed_ = 0;        // tasks pushed so far
  std::uint64_t running_task_ = 0;  // the worker's current task; read only by its closures
  // Set with FreeTiming::kWhenWaited, else null.
  const std::shared_ptr<ParkedFrees> parked_;
  bool stopping_ = false;
  std::exception_ptr failure_;
  std::string failure_message_;
  std::thread worker_;  // last member: starts after everything above is constructed
};

}  // namespace zest::cpu
