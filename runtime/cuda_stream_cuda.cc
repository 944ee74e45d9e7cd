#include "runtime/cuda_stream.h"

#include <algorithm>
#include <exception>
#include <functional>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "base/cublas_check.h"
#include "base/cublaslt_library.h"
#include "base/cuda_check.h"
#include "base/error.h"
#include "memory/cuda_pool_allocator.h"

namespace zest::cuda {
namespace detail {

// Positions on a stream count the closures enqueued on it: closure k is number k (from 1), and
// a record() or wait() made after k closures sits at position k.
struct StreamState {
  struct Wait {
    std::shared_ptr<StreamState> source;
    std::uint64_t source_mark;  // the event's position on `source`
    std::uint64_t after;        // this stream's position at the wait
  };

  explicit StreamState(std::string stream_name) : name(std::move(stream_name)) {}

  const std::string name;
  std::mutex mutex;
  std::uint64_t enqueued = 0;
  std::uint64_t failed_at = 0;  // 0: not failed; else the closure that threw
  std::exception_ptr failure;
  std::string failure_message;
  // Note: one entry per source stream (the latest mark, the earliest wait): the failure that
  // reaches a waiter may be one that came after the event it waited on, but a failed rank fails
  // anyway, and the list stays as short as the number of streams.
  std::vector<Wait> waits;
};

}  // namespace detail

namespace {

using detail::StreamState;

struct Failure {
  const StreamState* stream;  // where it happened
  std::exception_ptr error;
  std::string message;
};

// The failure that work at `position` on `state` depends on: the stream's own, else one that
// reached it through the events it waited on. `visited` breaks cycles (compute <-> comm).
std::optional<Failure> failure_before(StreamState& state, std::uint64_t position,
                                      std::vector<const StreamState*>& visited) {
  for (const StreamState* seen : visited) {
    if (seen == &state) return std::nullopt;
  }
  visited.push_back(&state);
  std::vector<StreamState::Wait> waits;
  {
    std::lock_guard lock(state.mutex);
    if (state.failed_at != 0 && state.failed_at <= position) {
      return Failure{&state, state.failure, state.failure_message};
    }
    waits = state.waits;
  }
  for (const StreamState::Wait& wait : waits) {
    if (wait.after > position) continue;
    if (auto found = failure_before(*wait.source, wait.source_mark, visited)) return found;
  }
  return std::nullopt;
}

std::optional<Failure> failure_before(StreamState& state, std::uint64_t position) {
  std::vector<const StreamState*> visited;
  return failure_before(state, position, visited);
}

Error echo(const Failure& failure) {
  return Error(ErrorKind::kPeerFailure, "waited on an event of stream '" + failure.stream->name +
                                            "', which failed: " + failure.message);
}

struct HostClosure {
  std::shared_ptr<StreamState> state;
  std::uint64_t number;
  std::function<void()> work;
};

void CUDART_CB run_host_closure(void* data) {
  // Note: declared before the closure, so the closure's captures (Buffers among them) are
  // destroyed inside the scope and their frees are deferred, not CUDA calls made here.
  CudaHostFunctionScope scope;
  std::unique_ptr<HostClosure> closure(static_cast<HostClosure*>(data));
  StreamState& state = *closure->state;
  if (failure_before(state, closure->number - 1)) return;  // skipped, as on a failed CPU stream
  try {
    closure->work();
  } catch (...) {
    std::string message;
    try {
      throw;
    } catch (const std::exception& error) {
      message = error.what();
    } catch (...) {
      message = "an exception that is not a std::exception";
    }
    std::lock_guard lock(state.mutex);
    if (state.failed_at == 0) {
      state.failed_at = closure->number;
      state.failure = std::current_exception();
      state.failure_message = std::move(message);
    }
  }
}

// Re-raises `error` (a zest Error or not) as an Error with `context` in front.
[[noreturn]] void raise_with_context(const std::exception_ptr& error, const std::string& message,
                                     const std::string& context) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    raise(with_context(e, context));
  } catch (...) {
    throw Error(ErrorKind::kInternal, context + ": " + message);
  }
}

}  // namespace

CudaEvent::CudaEvent() {
  ZEST_CUDA_CHECK(cudaGetDevice(&device_));
  // Note: timing is off: events only order streams, and a timed event costs more to record.
  ZEST_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}

CudaEvent::~CudaEvent() {
  (void)cudaEventDestroy(event_);
  (void)cudaGetLastError();
}

void CudaEvent::synchronize() {
  std::shared_ptr<detail::StreamState> source;
  std::uint64_t mark;
  {
    std::lock_guard lock(mutex_);
    source = source_;
    mark = mark_;
  }
  if (!source) return;
  try {
    // Note: a host stream's worker waits here on a thread that never chose a device; its first
    // CUDA call would otherwise make device 0's context current there, a second context (and
    // hundreds of MiB) on GPU 0 for every process whose rank is on another GPU. The rank's own
    // threads are on this device already.
    ZEST_CUDA_CHECK(cudaSetDevice(device_));
    ZEST_CUDA_CHECK(cudaEventSynchronize(event_));
  } catch (const Error& error) {
    raise(with_context(error, "event of stream '" + source->name + "'"));
  }
  if (auto failure = failure_before(*source, mark)) throw echo(*failure);
}

CudaStream::CudaStream(std::string name, int device, Allocator* allocator)
    : name_(std::move(name)), device_(device),
      state_(std::make_shared<detail::StreamState>(name_)), allocator_(allocator) {
  ZEST_CUDA_CHECK(cudaSetDevice(device_));
  // Note: a blocking stream (not cudaStreamNonBlocking) orders with the legacy default stream,
  // on which the pool allocator allocates and frees by default: a free then waits for every
  // stream's earlier use of the buffer.
  ZEST_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamDefault));
}

CudaStream::~CudaStream() {
  (void)cudaStreamSynchronize(stream_);
  workspace_.reset();
  if (blas_ != nullptr) (void)cublaslt().destroy(blas_);
  (void)cudaStreamDestroy(stream_);
  (void)cudaGetLastError();
  // Streams that waited on each other hold each other's state: break the cycle.
  std::lock_guard lock(state_->mutex);
  state_->waits.clear();
}

void CudaStream::enqueue(std::function<void()> work) {
  auto closure = std::make_unique<HostClosure>();
  closure->state = state_;
  closure->work = std::move(work);
  {
    std::lock_guard lock(state_->mutex);
    closure->number = ++state_->enqueued;
  }
  try {
    ZEST_CUDA_CHECK(cudaLaunchHostFunc(stream_, run_host_closure, closure.get()));
  } catch (const Error& error) {
    raise(with_context(error, "stream '" + name_ + "'"));
  }
  closure.release();  // run_host_closure owns it now
}

void CudaStream::record(Event& event) {
  auto* own_kind = dynamic_cast<CudaEvent*>(&event);
  if (own_kind == nullptr) {
    throw Error(ErrorKind::kUsage, "stream '" + name_ + "': record() of another device's event "
                                   "(make it with the device that made this stream)");
  }
  CudaEvent& cuda_event = *own_kind;
  std::uint64_t mark;
  {
    std::lock_guard lock(state_->mutex);
    mark = state_->enqueued;
  }
  std::lock_guard lock(cuda_event.mutex_);
  try {
    ZEST_CUDA_CHECK(cudaEventRecord(cuda_event.event_, stream_));
  } catch (const Error& error) {
    raise(with_context(error, "stream '" + name_ + "'"));
  }
  cuda_event.source_ = state_;
  cuda_event.mark_ = mark;
}

void CudaStream::wait(Event& event) {
  auto* own_kind = dynamic_cast<CudaEvent*>(&event);
  if (own_kind == nullptr) {
    // Note: host work (a host stream's event) cannot be waited on by CUDA without a host
    // function that blocks, and a blocked host function stalls every stream's host functions
    // behind it; so the calling thread waits, and what it enqueues next starts after.
    event.synchronize();
    return;
  }
  CudaEvent& cuda_event = *own_kind;
  std::shared_ptr<detail::StreamState> source;
  std::uint64_t mark;
  {
    std::lock_guard lock(cuda_event.mutex_);
    source = cuda_event.source_;
    mark = cuda_event.mark_;
    if (!source) return;  // never recorded: a no-op, as in CUDA
    try {
      ZEST_CUDA_CHECK(cudaStreamWaitEvent(stream_, cuda_event.event_, 0));
    } catch (const Error& error) {
      raise(with_context(error, "stream '" + name_ + "'"));
    }
  }
  if (source == state_) return;
  std::lock_guard lock(state_->mutex);
  for (detail::StreamState::Wait& wait : state_->waits) {
    if (wait.source == source) {
      wait.source_mark = std::max(wait.source_mark, mark);
      return;
    }
  }
  state_->waits.push_back({std::move(source), mark, state_->enqueued});
}

void CudaStream::synchronize() {
  try {
    ZEST_CUDA_CHECK(cudaStreamSynchronize(stream_));
  } catch (const Error& error) {
    raise(with_context(error, "stream '" + name_ + "'"));
  }
  auto failure = failure_before(*state_, std::numeric_limits<std::uint64_t>::max());
  if (!failure) return;
  const std::string context = "stream '" + name_ + "'";
  if (failure->stream != state_.get()) raise(with_context(echo(*failure), context));
  raise_with_context(failure->error, failure->message, context);
}

void* CudaStream::workspace(std::size_t bytes, const char* kernel) {
  if (bytes <= workspace_.bytes()) return workspace_.data();
  if (allocator_ == nullptr) {
    throw Error(ErrorKind::kUsage, std::string(kernel) + ": stream '" + name_ +
                                       "' has no allocator for a kernel workspace");
  }
  // The old scratch goes first: the pool frees it after this stream's earlier launches.
  workspace_.reset();
  workspace_ = allocator_->allocate(bytes, Category::kWorkspace);
  return workspace_.data();
}

cublasLtHandle_t CudaStream::blas_handle() {
  if (blas_ == nullptr) {
    ZEST_CUDA_CHECK(cudaSetDevice(device_));
    ZEST_CUBLAS_CHECK(cublaslt().create(&blas_));
  }
  return blas_;
}

CudaStream& cuda_stream(Stream& stream, const char* kernel) {
  auto* cuda = dynamic_cast<CudaStream*>(&stream);
  if (cuda == nullptr) {
    throw Error(ErrorKind::kUsage, std::string(kernel) + ": stream '" + stream.name() +
                                       "' is not a CUDA stream");
  }
  return *cuda;
}

cudaStream_t stream_handle(Stream& stream, const char* kernel) {
  return cuda_stream(stream, kernel).handle();
}

}  // namespace zest::cuda
