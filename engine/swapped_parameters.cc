#include "engine/swapped_parameters.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "runtime/shape_device.h"

namespace zest {

namespace {

SwapOptions swap_options(const EngineOptions& options) {
  SwapOptions swap = options.aio;
  swap.path = options.offload_param.nvme_path;
  return swap;
}

}  // namespace

SwappedParameters::SwappedParameters(RankContext& context, const EngineOptions& options)
    : context_(context),
      options_(options),
      element_size_(dtype_size(options.compute_dtype)),
      store_(swap_options(options), context.rank_in_world(), runs_work(context.device)) {
  const std::string rank = "rank " + std::to_string(context.rank);
  reads_ = context.device.create_host_stream(rank + " nvme parameter read");
  writes_ = context.device.create_host_stream(rank + " nvme parameter write");
}

SwappedParameters::~SwappedParameters() {
  try {
    synchronize();
  } catch (...) {
    // Whoever synchronizes next reports the failure; a destructor must not throw.
  }
}

void SwappedParameters::synchronize() {
  reads_->synchronize();
  writes_->synchronize();
}

ParameterSwapLayout parameter_swap_layout(const std::vector<std::size_t>& shard_lengths,
                                          std::size_t element_size,
                                          const OffloadParamOptions& options) {
  ParameterSwapLayout layout;
  std::size_t in_host = 0;  // elements kept in host memory (max_in_cpu)
  std::size_t largest = 0;
  for (std::size_t shard : shard_lengths) {
    const bool kept = in_host + shard <= options.max_in_cpu;
    if (kept) in_host += shard;
    layout.on_nvme.push_back(!kept);
    // As SwapStore::reserve rounds it.
    const std::size_t bytes =
        kept ? 0 : round_up(std::max<std::size_t>(shard * element_size, 1), kSwapAlignment);
    layout.region_bytes.push_back(bytes);
    largest = std::max(largest, bytes);
  }
  if (largest == 0) return layout;
  // Note: a buffer holds buffer_size elements, in whole O_DIRECT blocks, and never more than the
  // largest region: a shard larger than a buffer moves in chunks, one buffer each.
  const std::size_t wanted = options.buffer_size * element_size;
  layout.chunk_bytes =
      std::min(largest, std::max(kSwapAlignment, wanted / kSwapAlignment * kSwapAlignment));
  layout.buffers = std::max<std::size_t>(1, options.buffer_count);
  return layout;
}

std::size_t ParameterSwapLayout::swap_bytes() const {
  std::size_t total = 0;
  for (std::size_t bytes : region_bytes) total += bytes;
  return total;
}

std::size_t ParameterSwapLayout::buffer_bytes() const {
  return chunk_bytes == 0 ? 0 : buffers * (chunk_bytes + kSwapAlignment);
}

void account_parameter_swap(MemoryPrediction& prediction, const ParameterSwapLayout& layout,
                            const std::vector<std::size_t>& shard_lengths,
                            std::size_t element_size) {
  for (std::size_t u = 0; u < shard_lengths.size(); ++u) {
    if (layout.on_nvme[u]) prediction.host_params -= shard_lengths[u] * element_size;
  }
  prediction.host_params += layout.buffer_bytes();
  prediction.nvme += layout.swap_bytes();
  prediction.nvme_params = layout.swap_bytes();
}

void SwappedParameters::allocate(const std::vector<FlatUnit>& units) {
  std::vector<std::size_t> shards;
  for (const FlatUnit& unit : units) shards.push_back(unit.layout.shard_length());
  const ParameterSwapLayout layout =
      parameter_swap_layout(shards, element_size_, options_.offload_param);
  regions_.clear();
  for (std::size_t u = 0; u < units.size(); ++u) {
    last_read_.push_back(context_.device.create_host_event());
    last_written_.push_back(context_.device.create_host_event());
    regions_.push_back(layout.on_nvme[u]
                           ? std::make_unique<SwapRegion>(store_.reserve(shards[u] * element_size_))
                           : nullptr);
  }
  chunk_bytes_ = layout.chunk_bytes;
  Allocator& host = context_.device.host_allocator();
  for (std::size_t s = 0; s < layout.buffers; ++s) {
    StagingBuffer staging;
    AlignedHostBuffer aligned = allocate_aligned(host, chunk_bytes_, Category::kParams);
    staging.buffer = std::move(aligned.buffer);
    staging.data = aligned.data;
    staging.read = context_.device.create_host_event();
    staging.copied = context_.device.create_event();
    staging.written = context_.device.create_host_event();
    staging_.push_back(std::move(staging));
  }
  store_.open();
}

std::size_t SwappedParameters::host_bytes() const {
  std::size_t bytes = 0;
  for (const StagingBuffer& staging : staging_) bytes += staging.buffer.bytes();
  return bytes;
}

const SwapRegion* SwappedParameters::region_of(const FlatUnit& unit) const {
  const auto index = static_cast<std::size_t>(unit.index);
  return index < regions_.size() ? regions_[index].get() : nullptr;
}

SwappedParameters::StagingBuffer& SwappedParameters::next_staging() {
  StagingBuffer& staging = staging_.at(next_staging_);
  next_staging_ = (next_staging_ + 1) % staging_.size();
  return staging;
}

SwapTrace SwappedParameters::trace(const char* what, const FlatUnit& unit,
                                   std::size_t offset) const {
  if (context_.trace == nullptr) return {};
  return {context_.trace, context_.rank_in_world(),
          std::string(what) + " parameters of " + unit.layout.unit_name() + " at byte " +
              std::to_string(offset)};
}

void SwappedParameters::fetch(const FlatUnit& unit, Stream& stream, void* device) {
  const SwapRegion& region = *region_of(unit);
  const auto index = static_cast<std::size_t>(unit.index);
  const std::size_t shard_bytes = unit.layout.shard_length() * element_size_;
  reads_->wait(*last_written_[index]);  // the shard's last update is on disk
  for (std::size_t offset = 0; offset < region.bytes; offset += chunk_bytes_) {
    StagingBuffer& staging = next_staging();
    const std::size_t bytes = std::min(chunk_bytes_, region.bytes - offset);
    if (staging.released) reads_->wait(*staging.released);
    enqueue_swap_read(*reads_, store_, region, offset, staging.data, bytes,
                      trace("read", unit, offset));
    reads_->record(*staging.read);
    stream.wait(*staging.read);
    if (offset < shard_bytes) {
      context_.device.copy(stream, static_cast<char*>(device) + offset, staging.data,
                           std::min(bytes, shard_bytes - offset));
    }
    stream.record(*staging.copied);
    staging.released = staging.copied.get();
  }
  reads_->record(*last_read_[index]);
}

void SwappedParameters::store(const FlatUnit& unit, Stream& stream, const void* device) {
  const SwapRegion& region = *region_of(unit);
  const auto index = static_cast<std::size_t>(unit.index);
  const std::size_t shard_bytes = unit.layout.shard_length() * element_size_;
  writes_->wait(*last_read_[index]);  // no read of the old shard is still running
  // Note: only the shard's bytes are copied; a last chunk's tail past them (the region's
  // rounding to whole blocks) is written as the buffer holds it and never read back.
  for (std::size_t offset = 0; offset < shard_bytes; offset += chunk_bytes_) {
    StagingBuffer& staging = next_staging();
    const std::size_t bytes = std::min(chunk_bytes_, region.bytes - offset);
    if (staging.released) stream.wait(*staging.released);
    context_.device.copy(stream, staging.data, static_cast<const char*>(device) + offset,
                         std::min(bytes, shard_bytes - offset));
    stream.record(*staging.copied);
    writes_->wait(*staging.copied);
    enqueue_swap_write(*writes_, store_, region, offset, staging.data, bytes,
                       trace("write", unit, offset));
    writes_->record(*staging.written);
    staging.released = staging.written.get();
  }
  writes_->record(*last_written_[index]);
}

void SwappedParameters::store_from_host(const FlatUnit& unit, const void* host, Event& ready,
                                        Stream& after) {
  const SwapRegion& region = *region_of(unit);
  const auto index = static_cast<std::size_t>(unit.index);
  writes_->wait(*last_read_[index]);
  writes_->wait(ready);
  // Note: `host` is the host optimizer's transfer shard, not block-aligned, so the store writes
  // it through the page cache; a later O_DIRECT read of the region sees it (the kernel flushes
  // a range's cached pages before a direct read of it).
  enqueue_swap_write(*writes_, store_, region, 0, host, unit.layout.shard_length() * element_size_,
                     trace("write", unit, 0));
  writes_->record(*last_written_[index]);
  after.wait(*last_written_[index]);
}

void SwappedParameters::read(const FlatUnit& unit, std::size_t first, std::size_t count,
                             void* host) {
  if (!store_.backed()) return;
  store_.read(*region_of(unit), first * element_size_, host, count * element_size_);
}

void SwappedParameters::write(const FlatUnit& unit, std::size_t first, std::size_t count,
                              const void* host) {
  if (!store_.backed()) return;
  store_.write(*region_of(unit), first * element_size_, host, count * element_size_);
}

std::function<void(bool, std::size_t, std::size_t, void*)> SwappedParameters::access(
    const FlatUnit& unit) {
  return [this, &unit](bool write_it, std::size_t first, std::size_t count, void* host) {
    if (write_it) {
      write(unit, first, count, host);
    } else {
      read(unit, first, count, host);
    }
  };
}

}  // namespace zest
