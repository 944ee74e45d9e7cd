// The NVMe tier's keys, DeepSpeed's names and meanings: offload_optimizer's nvme_path,
// buffer_count and fast_init (device "nvme"), zero_optimization.sub_group_size, and the `aio`
// block. aio's keys are applied where they mean something for io_uring (block_size, queue_depth,
// single_submit, and thread_count for the pread/pwrite fallback); overlap_events is accepted at
// its default only, and the resolved config says why under aio.not_applied, which the config
// writes and never reads. zest's own aio.backend picks io_uring, the threads, or auto.
#include <string>

#include "config/blocks.h"

namespace zest::config_blocks {

using namespace config_reading;

namespace {

constexpr const char* kOverlapEventsWhy =
    "zest always overlaps the tier's reads and writes with the optimizer: they run on I/O "
    "streams of their own, ordered by events";

}  // namespace

// Note: the keys are read (and checked) at any device, as DeepSpeed accepts them; their defaults
// are written into the resolved config only with "nvme", where they mean something.
void parse_offload_optimizer_nvme(Block& offload, TrainConfig& out) {
  OffloadOptions& options = out.engine.offload_optimizer;
  const bool nvme = options.on_nvme();
  auto value = [&](const std::string& key, json fallback) -> json {
    if (nvme) return offload.get_or(key, std::move(fallback));
    const json* given = offload.find(key);
    return given ? *given : fallback;
  };
  if (nvme) offload.require("nvme_path", "the folder the swap files are made under (a fast disk)");
  options.nvme_path = read_string(value("nvme_path", ""), offload.path("nvme_path"));
  if (nvme && options.nvme_path.empty()) {
    config_error(offload.path("nvme_path"), "must name a folder for the swap files, got \"\"");
  }
  options.buffer_count = static_cast<std::size_t>(
      read_integer_at_least(value("buffer_count", 4), offload.path("buffer_count"), 1));
  options.fast_init = read_bool(value("fast_init", false), offload.path("fast_init"));
}

void parse_sub_group_size(Block& zero, TrainConfig& out) {
  out.engine.offload_optimizer.sub_group_size = static_cast<std::size_t>(read_integer_at_least(
      zero.get_or("sub_group_size", 1000000000), zero.path("sub_group_size"), 1));
}

void parse_aio(Block& root, TrainConfig& out) {
  Block block(root.object_or_empty("aio"), "aio",
              {"block_size", "queue_depth", "thread_count", "single_submit", "overlap_events",
               "backend", "not_applied"});
  SwapOptions& aio = out.engine.aio;
  aio.block_size = static_cast<std::size_t>(
      read_integer_at_least(block.get_or("block_size", 1048576), block.path("block_size"), 4096));
  if (aio.block_size % kSwapAlignment != 0) {
    config_error(block.path("block_size"),
                 "must be a multiple of 4096 (O_DIRECT's unit), got " + std::to_string(aio.block_size));
  }
  aio.io.queue_depth = static_cast<std::size_t>(
      read_integer_at_least(block.get_or("queue_depth", 8), block.path("queue_depth"), 1));
  aio.io.thread_count = static_cast<int>(
      read_integer_at_least(block.get_or("thread_count", 1), block.path("thread_count"), 1));
  aio.io.single_submit =
      read_bool(block.get_or("single_submit", false), block.path("single_submit"));
  const bool overlap = read_bool(block.get_or("overlap_events", true), block.path("overlap_events"));
  if (!overlap) {
    config_error(block.path("overlap_events"),
                 std::string("false is not supported: ") + kOverlapEventsWhy + "; remove the key");
  }
  const std::string backend = read_string(block.get_or("backend", "auto"), block.path("backend"));
  if (backend == "auto") {
    aio.io.backend = SwapBackend::kAuto;
  } else if (backend == "io_uring") {
    aio.io.backend = SwapBackend::kIoUring;
  } else if (backend == "threads") {
    aio.io.backend = SwapBackend::kThreads;
  } else {
    config_error(block.path("backend"),
                 "must be auto, io_uring or threads, got \"" + backend + "\"");
  }
  // Written for --print-config; whatever a config says here is replaced.
  block.get_or("not_applied", json::object()) = json{{"overlap_events", kOverlapEventsWhy}};
}

}  // namespace zest::config_blocks
