// The CPU device's stream: one worker thread draining a queue of closures, and its event, a
// fence with a sequence number. Used through the Stream and Event interfaces.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/stream.h"

namespace zest::cpu {

class CpuEvent final : public Event {
 public:
  void synchronize() override;

 private:
  friend class CpuStream;

  // Called on the recording stream's worker when the work before record number `sequence`
  // has run; `failure` is empty unless that stream had failed.
  void complete(std::uint64_t sequence, const std::string& failure);
  // Blocks until record number `sequence` has completed; throws if its stream had failed.
  void wait_for(std::uint64_t sequence);

  std::mutex mutex_;
  std::condition_variable completed_cv_;
  std::uint64_t recorded_ = 0;   // how many times record() was called
  std::uint64_t completed_ = 0;  // the last record() whose preceding work has run
  std::string failure_;
};

class CpuStream final : public Stream {
 public:
  explicit CpuStream(std::string name);
  ~CpuStream() override;  // drains the queue, then joins the worker; never throws

  CpuStream(const CpuStream&) = delete;
  CpuStream& operator=(const CpuStream&) = delete;

  const std::string& name() const override { return name_; }
  DeviceKind device_kind() const override { return DeviceKind::kCpu; }
  void enqueue(std::function<void()> work) override;
  void record(Event& event) override;
  void wait(Event& event) override;
  void synchronize() override;

 private:
  struct Task {
    std::function<void()> work;
    bool runs_after_failure = false;  // event completions must run, or waiters would hang
  };

  void push(Task task);
  void run_worker();
  void rethrow_failure_locked() const;

  const std::string name_;
  std::mutex mutex_;
  std::condition_variable queue_cv_;  // signals the worker: a task arrived or stop
  std::condition_variable idle_cv_;   // signals synchronize(): the queue drained
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  std::exception_ptr failure_;
  std::string failure_message_;
  std::thread worker_;  // last member: starts after everything above is constructed
};

}  // namespace zest::cpu
