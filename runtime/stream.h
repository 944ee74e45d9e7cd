// A stream runs work in the order it was enqueued, asynchronously to the caller; an event
// recorded on one stream and waited on by another orders work across streams without blocking
// the host. This is CUDA's model, and zest keeps it on every device so that the engine is
// written once. Invariant: an error inside enqueued work is never lost — it makes the stream
// fail (later work is skipped, as with CUDA's sticky errors) and is re-raised, naming the
// stream, by every later synchronize() and by any stream that waits on its events.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace zest {

enum class DeviceKind { kCpu, kCuda };

// A point in a stream's work. Device-specific; made by Device::create_event().
class Event {
 public:
  virtual ~Event() = default;
  // Blocks the calling host thread until the work before the last record() has run. Throws if
  // that work failed. Returns at once if the event was never recorded.
  virtual void synchronize() = 0;
};

class Stream {
 public:
  virtual ~Stream() = default;

  virtual const std::string& name() const = 0;
  virtual DeviceKind device_kind() const = 0;

  // Runs `work` after everything enqueued before it. On the CPU device it runs on the stream's
  // worker thread; on CUDA, as a host function in stream order. An exception it throws makes
  // the stream fail.
  virtual void enqueue(std::function<void()> work) = 0;

  // Marks the current end of this stream's work in `event`.
  virtual void record(Event& event) = 0;

  // Work enqueued after this call waits until the work before `event`'s last record() has run.
  // Waiting on an event that was never recorded is a no-op, as in CUDA. `event` may come from
  // another kind of stream (a device's host stream, Device::create_host_stream): a CPU stream
  // then blocks its worker on it in order; a CUDA stream, which cannot wait for host work
  // without blocking CUDA's own thread, makes the calling host thread wait for it now.
  virtual void wait(Event& event) = 0;

  // Blocks until all enqueued work has run; throws the stream's error if it failed.
  virtual void synchronize() = 0;
};

}  // namespace zest
