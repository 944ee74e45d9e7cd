#include "checkpoint/state_shard_copies.h"

#include <algorithm>
#include <vector>

#include "runtime/host_copies.h"

namespace zest {

namespace {

std::size_t chunk_elements(DType dtype) {
  return std::max<std::size_t>(1, kStateCopyChunkBytes / dtype_size(dtype));
}

}  // namespace

void read_state_elements(const RankContext& context, const void* view, DType dtype,
                         std::size_t count,
                         const std::function<void(const void*, std::size_t, std::size_t)>& consume) {
  if (context.device.kind() == DeviceKind::kCpu) {
    consume(view, 0, count);
    return;
  }
  const std::size_t size = dtype_size(dtype);
  const std::size_t chunk = chunk_elements(dtype);
  std::vector<unsigned char> host(std::min(count, chunk) * size);
  for (std::size_t first = 0; first < count; first += chunk) {
    const std::size_t piece = std::min(chunk, count - first);
    read_to_host(context.device, context.comm, host.data(),
                 static_cast<const char*>(view) + first * size, piece * size);
    consume(host.data(), first, piece);
  }
}

void write_state_elements(const RankContext& context, void* view, DType dtype, std::size_t count,
                          const std::function<void(void*, std::size_t, std::size_t)>& produce) {
  if (context.device.kind() == DeviceKind::kCpu) {
    produce(view, 0, count);
    return;
  }
  const std::size_t size = dtype_size(dtype);
  const std::size_t chunk = chunk_elements(dtype);
  std::vector<unsigned char> host(std::min(count, chunk) * size);
  for (std::size_t first = 0; first < count; first += chunk) {
    const std::size_t piece = std::min(chunk, count - first);
    produce(host.data(), first, piece);
    // write_from_host has read `host` when it returns, so the next piece may refill it.
    write_from_host(context.device, context.comm, static_cast<char*>(view) + first * size,
                    host.data(), piece * size);
  }
  context.comm.synchronize();
}

void read_state_elements(const RankContext& context, const StateShard& shard, std::size_t first,
                         std::size_t count,
                         const std::function<void(const void*, std::size_t, std::size_t)>& consume) {
  const std::size_t size = dtype_size(shard.dtype);
  if (!shard.swap) {
    read_state_elements(context, static_cast<const char*>(shard.data) + first * size, shard.dtype,
                        count, consume);
    return;
  }
  const std::size_t chunk = chunk_elements(shard.dtype);
  std::vector<unsigned char> host(std::min(count, chunk) * size);
  for (std::size_t done = 0; done < count; done += chunk) {
    const std::size_t piece = std::min(chunk, count - done);
    shard.swap(false, first + done, piece, host.data());
    consume(host.data(), done, piece);
  }
}

void write_state_elements(const RankContext& context, const StateShard& shard, std::size_t first,
                          std::size_t count,
                          const std::function<void(void*, std::size_t, std::size_t)>& produce) {
  const std::size_t size = dtype_size(shard.dtype);
  if (!shard.swap) {
    write_state_elements(context, static_cast<char*>(shard.data) + first * size, shard.dtype,
                         count, produce);
    return;
  }
  const std::size_t chunk = chunk_elements(shard.dtype);
  std::vector<unsigned char> host(std::min(count, chunk) * size);
  for (std::size_t done = 0; done < count; done += chunk) {
    const std::size_t piece = std::min(chunk, count - done);
    produce(host.data(), done, piece);
    shard.swap(true, first + done, piece, host.data());
  }
}

}  // namespace zest
