// The NVMe tier's I/O engines: a batch of reads or writes at file offsets, run with up to
// `queue_depth` requests in flight through io_uring, or, where io_uring cannot be set up (an old
// kernel, a sandbox, kernel.io_uring_disabled), by a pool of pread/pwrite threads. Both run the
// same requests to the same bytes. Invariant: run() returns only when every request of the batch
// has completed or failed; a failure (EIO, ENOSPC, a short read) is one kIo Error naming the file
// and the offset, raised after the batch's other requests have finished with its buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace zest {

struct SwapRequest {
  bool write = false;
  int fd = -1;
  std::uint64_t offset = 0;  // in the file
  void* data = nullptr;      // host memory: read into, or written from
  std::size_t bytes = 0;
  const std::string* file = nullptr;  // the file's path, for errors; outlives the request
};

// A failure injected for tests: the `after`-th request (0-based, counted per engine) of the
// matching direction completes as the kind says instead of running.
enum class SwapFaultKind { kNone, kIoError, kShortRead, kNoSpace };

struct SwapFault {
  SwapFaultKind kind = SwapFaultKind::kNone;
  std::size_t after = 0;
};

enum class SwapBackend { kAuto, kIoUring, kThreads };

struct SwapIoOptions {
  SwapBackend backend = SwapBackend::kAuto;  // kAuto: io_uring, else threads (said once)
  std::size_t queue_depth = 8;               // aio.queue_depth: requests in flight (io_uring)
  int thread_count = 1;                      // aio.thread_count: pread/pwrite threads
  bool single_submit = false;                // aio.single_submit: one submit call per request
  SwapFault fault;
};

class SwapIo {
 public:
  virtual ~SwapIo() = default;
  virtual void run(const std::vector<SwapRequest>& requests) = 0;
  virtual const char* name() const = 0;  // "io_uring" or "threads"
};

// io_uring when the options allow it and the kernel sets it up; otherwise the thread pool, with
// one line on stderr the first time in the process that io_uring was wanted and refused. A
// backend of kIoUring that cannot be set up is a kIo Error saying why.
std::unique_ptr<SwapIo> make_swap_io(const SwapIoOptions& options);

const char* swap_backend_name(SwapBackend backend);

}  // namespace zest
