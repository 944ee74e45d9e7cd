#include "runtime/cpu_stream.h"

#include <tuple>
#include <utility>

#include "base/error.h"
#include "runtime/thread_start.h"

namespace zest::cpu {

void ParkedFree::run() {
  if (done_.exchange(true)) return;
  free_();
  free_ = nullptr;
}

void ParkedFrees::park(std::uint64_t task, std::shared_ptr<ParkedFree> free) {
  std::lock_guard lock(mutex_);
  if (!held_.insert(free.get()).second) return;
  parked_.emplace_back(task, std::move(free));
}

std::vector<std::shared_ptr<ParkedFree>> ParkedFrees::take_through(std::uint64_t task) {
  std::vector<std::shared_ptr<ParkedFree>> taken;
  std::lock_guard lock(mutex_);
  auto kept = parked_.begin();
  for (auto& entry : parked_) {
    if (entry.first <= task) {
      held_.erase(entry.second.get());
      taken.push_back(std::move(entry.second));
    } else {
      if (&*kept != &entry) *kept = std::move(entry);
      ++kept;
    }
  }
  parked_.erase(kept, parked_.end());
  return taken;
}

std::vector<std::shared_ptr<ParkedFree>> ParkedFrees::copy_through(std::uint64_t task) {
  std::vector<std::shared_ptr<ParkedFree>> copies;
  std::lock_guard lock(mutex_);
  auto kept = parked_.begin();
  for (auto& entry : parked_) {
    if (entry.second->done()) {  // run through another holder: nothing left to prove
      held_.erase(entry.second.get());
      continue;
    }
    if (entry.first <= task) copies.push_back(entry.second);
    if (&*kept != &entry) *kept = std::move(entry);
    ++kept;
  }
  parked_.erase(kept, parked_.end());
  return copies;
}

void CpuEvent::synchronize() {
  std::uint64_t sequence;
  {
    std::lock_guard lock(mutex_);
    sequence = recorded_;
  }
  wait_for(sequence);
}

void CpuEvent::complete(std::uint64_t sequence, const std::string& failure) {
  std::lock_guard lock(mutex_);
  if (sequence > completed_) completed_ = sequence;
  if (!failure.empty()) failure_ = failure;
  // Note: notified under the lock. A host thread may see the completion without waiting (it
  // synchronizes just after the update) and destroy the event at once, as CUDA allows; a
  // notify after unlocking would then touch a destroyed condition variable.
  completed_cv_.notify_all();
}

void CpuEvent::wait_for(std::uint64_t sequence, ParkedFrees* adopter,
                        std::uint64_t adopter_task) {
  std::unique_lock lock(mutex_);
  completed_cv_.wait(lock, [&] { return completed_ >= sequence; });
  if (!failure_.empty()) {
    throw Error(ErrorKind::kPeerFailure, "waited on an event of " + failure_);
  }
  std::shared_ptr<ParkedFrees> parked;
  std::uint64_t task = 0;
  for (const RecordPlace& place : places_) {
    if (place.sequence == sequence) std::tie(parked, task) = std::tie(place.parked, place.task);
  }
  if (adopter == nullptr) {
    while (!places_.empty() && places_.front().sequence <= sequence) places_.pop_front();
  }
  lock.unlock();
  if (parked == nullptr) return;
  if (adopter == nullptr) {
    for (auto& free : parked->take_through(task)) free->run();
  } else {
    for (auto& free : parked->copy_through(task)) adopter->park(adopter_task, std::move(free));
  }
}

CpuStream::CpuStream(std::string name, FreeTiming frees)
    : name_(std::move(name)),
      parked_(frees == FreeTiming::kWhenWaited ? std::make_shared<ParkedFrees>() : nullptr),
      worker_(start_thread("the thread of stream '" + name_ + "'", [this] { run_worker(); })) {}

CpuStream::~CpuStream() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  worker_.join();
  if (parked_ != nullptr) run_parked_through(pushed_);  // nothing waits any more
}

std::uint64_t CpuStream::push(Task task) {
  std::uint64_t number;
  {
    std::lock_guard lock(mutex_);
    number = task.number = ++pushed_;
    queue_.push_back(std::move(task));
  }
  queue_cv_.notify_one();
  return number;
}

void CpuStream::enqueue(std::function<void()> work) { push({std::move(work), false}); }

void CpuStream::enqueue_free(std::function<void()> free) {
  push({std::move(free), false, parked_ != nullptr});
}

void CpuStream::run_parked_through(std::uint64_t task) {
  for (auto& free : parked_->take_through(task)) free->run();
}

void CpuStream::record(Event& event) {
  auto* own_kind = dynamic_cast<CpuEvent*>(&event);
  if (own_kind == nullptr) {
    throw Error(ErrorKind::kUsage, "stream '" + name_ + "': record() of another device's event "
                                   "(make it with the device that made this stream)");
  }
  CpuEvent& cpu_event = *own_kind;
  std::uint64_t sequence;
  {
    std::lock_guard lock(cpu_event.mutex_);
    sequence = ++cpu_event.recorded_;
  }
  // Note: the completion runs even when the stream has failed, carrying the failure, so a
  // stream waiting on this event fails too instead of waiting forever.
  const std::uint64_t task = push({[this, &cpu_event, sequence] {
          std::string failure;
          {
            std::lock_guard lock(mutex_);
            if (failure_) failure = "stream '" + name_ + "', which failed: " + failure_message_;
          }
          cpu_event.complete(sequence, failure);
        },
        true});
  if (parked_ == nullptr) return;
  // Note: added after the push; waits on this record come from the host after record() returns.
  std::lock_guard lock(cpu_event.mutex_);
  cpu_event.places_.push_back({sequence, parked_, task});
  if (cpu_event.places_.size() > CpuEvent::kPlacesKept) cpu_event.places_.pop_front();
}

void CpuStream::wait(Event& event) {
  auto* own_kind = dynamic_cast<CpuEvent*>(&event);
  if (own_kind == nullptr) {
    // Another device's event (a CUDA stream's, waited on by a host stream): its synchronize
    // blocks this worker until the work before its last record() has run. Invariant: "last"
    // is when the worker gets here, not when wait() was called (CUDA cannot capture a record
    // as cudaStreamWaitEvent does), so the event is not recorded again before this wait has
    // run. The offload engine records each unit's copy event once a step, and its host thread
    // waits for that unit's host update (queued after this wait) before the step ends.
    push({[this, &event] {
            try {
              event.synchronize();
            } catch (...) {
              std::lock_guard lock(mutex_);
              if (!failure_) throw;
            }
          },
          true});
    return;
  }
  CpuEvent& cpu_event = *own_kind;
  std::uint64_t sequence;
  {
    std::lock_guard lock(cpu_event.mutex_);
    sequence = cpu_event.recorded_;
  }
  if (sequence == 0) return;
  // Note: the wait runs even when this stream has failed. Skipped tasks are destroyed in queue
  // order, and destroying one may free a buffer (the engine's stream-ordered frees capture
  // them); without the wait, that free would overtake the other stream's use of the buffer.
  push({[this, &cpu_event, sequence] {
          try {
            cpu_event.wait_for(sequence, parked_.get(), running_task_);
          } catch (...) {
            std::lock_guard lock(mutex_);
            if (!failure_) throw;  // this stream's own failure, from now on
          }
        },
        true});
}

void CpuStream::synchronize() {
  std::unique_lock lock(mutex_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  if (parked_ != nullptr) {
    const std::uint64_t pushed = pushed_;
    lock.unlock();
    run_parked_through(pushed);
    lock.lock();
  }
  rethrow_failure_locked();
}

void CpuStream::rethrow_failure_locked() const {
  if (!failure_) return;
  try {
    std::rethrow_exception(failure_);
  } catch (const std::exception& error) {
    raise(with_context(error, "stream '" + name_ + "'"));
  } catch (...) {
    throw Error(ErrorKind::kInternal, "stream '" + name_ + "': " + failure_message_);
  }
}

void CpuStream::run_worker() {
  std::unique_lock lock(mutex_);
  for (;;) {
    queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything enqueued has run
    Task task = std::move(queue_.front());
    queue_.pop_front();
    bool skip = failure_ && !task.runs_after_failure;
    busy_ = true;
    running_task_ = task.number;
    lock.unlock();
    if (task.parks && !skip) {
      parked_->park(task.number, std::make_shared<ParkedFree>(std::move(task.work)));
      skip = true;
    }
    std::exception_ptr error;
    if (!skip) {
      try {
        task.work();
      } catch (...) {
        error = std::current_exception();
      }
    }
    task = {};  // destroy captured state outside the lock
    lock.lock();
    busy_ = false;
    if (error && !failure_) {
      failure_ = error;
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        failure_message_ = e.what();
      } catch (...) {
        failure_message_ = "an exception that is not a std::exception";
      }
    }
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

}  // namespace zest::cpu
