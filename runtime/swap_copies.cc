#include "runtime/swap_copies.h"

#include <utility>

namespace zest {

namespace {

void enqueue_swap_copy(Stream& stream, SwapStore& store, const SwapRegion& region,
                       std::size_t offset, void* host, std::size_t bytes, bool write,
                       SwapTrace trace) {
  if (!store.backed()) return;  // the shape-only tier moves nothing
  stream.enqueue([&store, region, offset, host, bytes, write, trace = std::move(trace)] {
    const std::int64_t begin = trace.recorder ? TraceRecorder::now_us() : 0;
    if (write) {
      store.write(region, offset, host, bytes);
    } else {
      store.read(region, offset, host, bytes);
    }
    if (trace.recorder) {
      trace.recorder->add({trace.rank, "nvme", trace.name, begin, TraceRecorder::now_us(),
                           static_cast<std::int64_t>(bytes)});
    }
  });
}

}  // namespace

void enqueue_swap_read(Stream& stream, SwapStore& store, const SwapRegion& region,
                       std::size_t offset, void* host, std::size_t bytes, SwapTrace trace) {
  enqueue_swap_copy(stream, store, region, offset, host, bytes, false, std::move(trace));
}

void enqueue_swap_write(Stream& stream, SwapStore& store, const SwapRegion& region,
                        std::size_t offset, const void* host, std::size_t bytes,
                        SwapTrace trace) {
  enqueue_swap_copy(stream, store, region, offset, const_cast<void*>(host), bytes, true,
                    std::move(trace));
}

}  // namespace zest
