#include "memory/swap_io.h"

#include <liburing.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "base/error.h"

namespace zest {

namespace {

// One transfer of a request still to run: all of it, or the rest after a short transfer.
struct Transfer {
  const SwapRequest* request = nullptr;
  std::uint64_t done = 0;
  char* data() const { return static_cast<char*>(request->data) + done; }
  std::uint64_t offset() const { return request->offset + done; }
  std::size_t bytes() const { return request->bytes - done; }
};

std::string failure_message(const Transfer& transfer, const std::string& why) {
  return std::string(transfer.request->write ? "writing " : "reading ") + std::to_string(transfer.bytes()) +
         " bytes at offset " + std::to_string(transfer.offset()) + " of swap file '" +
         *transfer.request->file + "' failed: " + why;
}

// Turns a completed transfer's result (bytes moved, or -errno) into: done (true), a remainder to
// run again (false), or a thrown kIo Error. A read that reaches the end of a preallocated file is
// a short read: the file was cut, or never had those bytes.
bool settle(Transfer& transfer, std::int64_t result) {
  if (result < 0) {
    const int error = static_cast<int>(-result);
    std::string why = std::strerror(error);
    if (error == ENOSPC) why += " (the swap's file system is full: free space or move nvme_path)";
    throw Error(ErrorKind::kIo, failure_message(transfer, why));
  }
  if (result == 0) {
    throw Error(ErrorKind::kIo,
                failure_message(transfer, transfer.request->write
                                           ? "no bytes written (file system full?)"
                                           : "short read: the file ends there (truncated "
                                             "or removed by something else)"));
  }
  transfer.done += static_cast<std::uint64_t>(result);
  return transfer.done >= transfer.request->bytes;
}

// Shared by both engines: counts requests per direction and fakes the configured failure.
class FaultInjector {
 public:
  explicit FaultInjector(SwapFault fault) : fault_(fault) {}
  // The result the request completes with instead of running, or 1 to run it.
  std::int64_t intercept(const Transfer& transfer) {
    if (fault_.kind == SwapFaultKind::kNone || transfer.done != 0) return 1;
    const bool reads = fault_.kind == SwapFaultKind::kShortRead;
    const bool writes = fault_.kind == SwapFaultKind::kNoSpace;
    if ((reads && transfer.request->write) || (writes && !transfer.request->write)) return 1;
    if (seen_.fetch_add(1) != fault_.after) return 1;
    switch (fault_.kind) {
      case SwapFaultKind::kIoError: return -EIO;
      case SwapFaultKind::kNoSpace: return -ENOSPC;
      default: return 0;  // kShortRead: the file "ends" at the request
    }
  }

 private:
  SwapFault fault_;
  std::atomic<std::size_t> seen_{0};
};

std::int64_t transfer_now(const Transfer& transfer) {
  const ssize_t moved =
      transfer.request->write
          ? ::pwrite(transfer.request->fd, transfer.data(), transfer.bytes(), static_cast<off_t>(transfer.offset()))
          : ::pread(transfer.request->fd, transfer.data(), transfer.bytes(), static_cast<off_t>(transfer.offset()));
  return moved < 0 ? -static_cast<std::int64_t>(errno) : moved;
}

class ThreadSwapIo final : public SwapIo {
 public:
  explicit ThreadSwapIo(const SwapIoOptions& options)
      : threads_(options.thread_count < 1 ? 1 : options.thread_count), faults_(options.fault) {}

  void run(const std::vector<SwapRequest>& requests) override {
    std::atomic<std::size_t> next{0};
    std::mutex failure_mutex;
    std::string failure;
    auto work = [&] {
      for (std::size_t i = next.fetch_add(1); i < requests.size(); i = next.fetch_add(1)) {
        try {
          Transfer transfer{&requests[i], 0};
          std::int64_t result = faults_.intercept(transfer);
          if (result == 1) result = transfer_now(transfer);
          while (!settle(transfer, result)) result = transfer_now(transfer);
        } catch (const Error& error) {
          const std::lock_guard<std::mutex> lock(failure_mutex);
          if (failure.empty()) failure = error.what();
        }
      }
    };
    const std::size_t helpers =
        std::min<std::size_t>(static_cast<std::size_t>(threads_), requests.size()) - (requests.empty() ? 0 : 1);
    std::vector<std::thread> pool;
    for (std::size_t t = 0; t < helpers; ++t) pool.emplace_back(work);
    work();  // the calling thread is one of the pool
    for (std::thread& thread : pool) thread.join();
    if (!failure.empty()) throw Error(ErrorKind::kIo, failure);
  }
  const char* name() const override { return "threads"; }

 private:
  int threads_;
  FaultInjector faults_;
};

class UringSwapIo final : public SwapIo {
 public:
  // `status`: io_uring_queue_init's result, negative (an errno) when the kernel refused the
  // ring; the object is then unusable and only destroyed.
  UringSwapIo(const SwapIoOptions& options, int& status)
      : depth_(options.queue_depth < 1 ? 1 : options.queue_depth),
        single_submit_(options.single_submit),
        faults_(options.fault) {
    status = io_uring_queue_init(static_cast<unsigned>(depth_), &ring_, 0);
    ready_ = status >= 0;
  }
  ~UringSwapIo() override {
    if (ready_) io_uring_queue_exit(&ring_);
  }

  void run(const std::vector<SwapRequest>& requests) override {
    // Note: one ring, used by one batch at a time; the store gives reads and writes an engine
    // each, so a read stream and a write stream never wait for each other here.
    const std::lock_guard<std::mutex> lock(mutex_);
    std::deque<Transfer> waiting;
    for (const SwapRequest& request : requests) waiting.push_back({&request, 0});
    std::vector<Transfer> submitted(depth_);
    std::vector<std::size_t> free_tags;
    for (std::size_t s = depth_; s > 0; --s) free_tags.push_back(s - 1);
    std::string failure;
    std::size_t in_flight = 0;
    while (!waiting.empty() || in_flight > 0) {
      while (!waiting.empty() && !free_tags.empty()) {
        Transfer transfer = waiting.front();
        waiting.pop_front();
        const std::int64_t injected = faults_.intercept(transfer);
        if (injected != 1) {
          settle_or_record(transfer, injected, waiting, failure);
          continue;
        }
        const std::size_t tag = free_tags.back();
        free_tags.pop_back();
        submitted[tag] = transfer;
        prepare(transfer, tag);
        ++in_flight;
        if (single_submit_) submit();
      }
      if (!single_submit_) submit();
      if (in_flight == 0) continue;
      io_uring_cqe* completion = nullptr;
      const int status = io_uring_wait_cqe(&ring_, &completion);
      if (status < 0) {
        if (status == -EINTR) continue;
        throw Error(ErrorKind::kIo, std::string("io_uring_wait_cqe: ") + std::strerror(-status));
      }
      const auto tag = static_cast<std::size_t>(io_uring_cqe_get_data64(completion));
      const std::int64_t result = completion->res;
      io_uring_cqe_seen(&ring_, completion);
      --in_flight;
      free_tags.push_back(tag);
      settle_or_record(submitted[tag], result, waiting, failure);
    }
    if (!failure.empty()) throw Error(ErrorKind::kIo, failure);
  }
  const char* name() const override { return "io_uring"; }

 private:
  void prepare(const Transfer& transfer, std::size_t tag) {
    io_uring_sqe* entry = io_uring_get_sqe(&ring_);
    if (entry == nullptr) {  // cannot happen: at most depth_ entries are in flight
      throw Error(ErrorKind::kInternal, "io_uring submission queue full");
    }
    if (transfer.request->write) {
      io_uring_prep_write(entry, transfer.request->fd, transfer.data(), static_cast<unsigned>(transfer.bytes()),
                          transfer.offset());
    } else {
      io_uring_prep_read(entry, transfer.request->fd, transfer.data(), static_cast<unsigned>(transfer.bytes()),
                         transfer.offset());
    }
    io_uring_sqe_set_data64(entry, tag);
  }
  void submit() {
    const int status = io_uring_submit(&ring_);
    if (status < 0 && status != -EINTR && status != -EAGAIN && status != -EBUSY) {
      throw Error(ErrorKind::kIo, std::string("io_uring_submit: ") + std::strerror(-status));
    }
  }
  // A failed transfer stops no other: the batch drains, then the first failure is raised.
  static void settle_or_record(Transfer& transfer, std::int64_t result, std::deque<Transfer>& waiting,
                               std::string& failure) {
    if (!failure.empty()) return;
    try {
      if (!settle(transfer, result)) waiting.push_front(transfer);
    } catch (const Error& error) {
      failure = error.what();
      waiting.clear();
    }
  }

  std::size_t depth_;
  bool single_submit_;
  FaultInjector faults_;
  std::mutex mutex_;
  io_uring ring_{};
  bool ready_ = false;
};

}  // namespace

const char* swap_backend_name(SwapBackend backend) {
  switch (backend) {
    case SwapBackend::kIoUring: return "io_uring";
    case SwapBackend::kThreads: return "threads";
    default: return "auto";
  }
}

std::unique_ptr<SwapIo> make_swap_io(const SwapIoOptions& options) {
  if (options.backend == SwapBackend::kThreads) return std::make_unique<ThreadSwapIo>(options);
  int status = 0;
  auto ring = std::make_unique<UringSwapIo>(options, status);
  if (status >= 0) return ring;
  {
    const std::string why = std::strerror(-status);
    if (options.backend == SwapBackend::kIoUring) {
      throw Error(ErrorKind::kIo, "aio.backend \"io_uring\": io_uring_queue_init failed (" + why +
                                      "); set \"auto\" or \"threads\" to use pread/pwrite threads");
    }
    static std::once_flag said;
    std::call_once(said, [&] {
      std::fprintf(stderr,
                   "zest: io_uring unavailable (%s); the NVMe tier uses %d pread/pwrite "
                   "thread(s) (aio.thread_count)\n",
                   why.c_str(), options.thread_count < 1 ? 1 : options.thread_count);
    });
    return std::make_unique<ThreadSwapIo>(options);
  }
}

}  // namespace zest
