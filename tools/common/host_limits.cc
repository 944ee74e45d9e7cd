#include "tools/common/host_limits.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "base/byte_size.h"
#include "base/dtype.h"
#include "base/error.h"
#include "engine/stage_plan.h"
#include "tools/common/model_size.h"

namespace zest {
namespace {

// Threads a rank of the local backend starts at least: its own and its streams' (compute, comm,
// prefetch: runtime/rank_resources.h), and a pipeline's two send streams.
constexpr std::uint64_t kThreadsPerRank = 4;
constexpr std::uint64_t kPipelineSendThreads = 2;
// Note: what a rank holds besides its model's buffers — its threads' stacks as touched, its
// device's and streams' state — measured as 1.3 MiB a rank (zest-train, an 8-8-4 MLP, from 128 to
// 512 ranks; a 2-layer 64-wide GPT takes 3.3 MiB); 1 MiB keeps the floor below any real run.
constexpr std::uint64_t kBytesPerRank = 1 << 20;

std::uint64_t saturating_multiply(std::uint64_t a, std::uint64_t b) {
  std::uint64_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? std::numeric_limits<std::uint64_t>::max()
                                                : product;
}

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<std::uint64_t>::max() : sum;
}

std::uint64_t read_number_file(const char* path) {
  std::ifstream file(path);
  std::uint64_t value = 0;
  return file >> value ? value : 0;
}

void lower_to(HostLimits& limits, std::uint64_t threads, const char* source) {
  if (threads == 0 || (limits.threads != 0 && limits.threads <= threads)) return;
  limits.threads = threads;
  limits.threads_source = source;
}

}  // namespace

HostLimits host_limits() {
  HostLimits limits;
  lower_to(limits, read_number_file("/proc/sys/kernel/threads-max"), "kernel.threads-max");
  lower_to(limits, read_number_file("/proc/sys/kernel/pid_max"), "kernel.pid_max");
  rlimit processes{};
  if (getrlimit(RLIMIT_NPROC, &processes) == 0 && processes.rlim_cur != RLIM_INFINITY) {
    lower_to(limits, static_cast<std::uint64_t>(processes.rlim_cur), "RLIMIT_NPROC (ulimit -u)");
  }
  limits.memory = host_memory_bytes();
  return limits;
}

RankFloor rank_floor(const TrainConfig& config) {
  const auto ranks = static_cast<std::uint64_t>(std::max(1, config.world.ranks));
  RankFloor floor;
  floor.threads = saturating_multiply(
      ranks, kThreadsPerRank + (config.pipeline.enabled() ? kPipelineSendThreads : 0));
  const ModelSize size = model_size(config.model);
  const std::uint64_t element = dtype_size(config.engine.compute_dtype);
  // A rank holds its units' full parameters while it computes them: every unit below stage 3
  // (without pipeline stages), the largest gathered one at stage 3. Note: model_size's largest
  // unit is the whole embedding; cut into vocabulary pieces, a block is what is surely gathered.
  std::uint64_t largest = size.largest_unit;
  std::uint64_t activations = 0;
  if (config.model.type == "gpt") {
    const GptConfig& gpt = config.model.gpt;
    const auto width = static_cast<std::uint64_t>(std::max(0, gpt.n_embd));
    if (gpt.vocab_pieces != 1) {
      largest = saturating_add(saturating_multiply(12, saturating_multiply(width, width)),
                               saturating_multiply(13, width));
    }
    // The embedding's output: micro-batch × seq_len × n_embd.
    const auto rows = static_cast<std::uint64_t>(std::max<std::int64_t>(0, config.micro_batch));
    activations = saturating_multiply(
        saturating_multiply(rows, static_cast<std::uint64_t>(std::max(0, gpt.seq_len))), width);
  }
  const bool whole =
      !StagePlan::of(config.engine.stage).params_sharded && !config.pipeline.enabled();
  std::uint64_t per_rank = saturating_multiply(whole ? size.parameters : largest, element);
  per_rank = saturating_add(per_rank, saturating_multiply(activations, element));
  per_rank = saturating_add(per_rank, kBytesPerRank);
  floor.bytes = saturating_multiply(ranks, per_rank);
  return floor;
}

void check_ranks_fit_host(const TrainConfig& config, const HostLimits& limits) {
  if (config.world.backend != "local" || config.world.device != DeviceKind::kCpu ||
      config.world.ranks <= 1) {
    return;
  }
  const RankFloor floor = rank_floor(config);
  const std::string ranks = fmt::format("world.ranks: {} ranks as threads of one process",
                                        config.world.ranks);
  if (limits.threads != 0 && floor.threads > limits.threads) {
    throw Error(ErrorKind::kConfig,
                fmt::format("{} need at least {} threads, more than this system allows ({}: {}); "
                            "run fewer ranks, or ranks as processes (world.backend \"mpi\")",
                            ranks, floor.threads, limits.threads_source, limits.threads));
  }
  if (limits.memory != 0 && floor.bytes > limits.memory) {
    throw Error(ErrorKind::kConfig,
                fmt::format("{} need at least {} of host memory (their gathered units, "
                            "activations and threads), more than this host's {}; run fewer "
                            "ranks or a smaller train_micro_batch_size_per_gpu",
                            ranks, format_bytes(static_cast<std::size_t>(floor.bytes)),
                            format_bytes(static_cast<std::size_t>(limits.memory))));
  }
}

}  // namespace zest
