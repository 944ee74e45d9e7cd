#include "tools/train/run_report.h"

#include <cmath>

#include <fmt/format.h>

#include "base/byte_size.h"
#include "tools/train/console.h"

namespace zest {

namespace {

std::string join_sizes(const std::vector<std::int64_t>& sizes) {
  return fmt::format("[{}]", fmt::join(sizes, ", "));
}

std::string describe_model(const ModelConfig& model) {
  if (model.type == "gpt") {
    const GptConfig& gpt = model.gpt;
    return fmt::format("gpt {}L {}H {}C vocab {} seq {}", gpt.n_layer, gpt.n_head, gpt.n_embd,
                       gpt.vocab_size, gpt.seq_len);
  }
  return "mlp " + join_sizes(model.mlp.sizes);
}

}  // namespace

nlohmann::ordered_json shortest_json(float value) {
  if (!std::isfinite(value)) return nullptr;
  return std::stod(fmt::format("{}", value));
}

std::string describe_run(const TrainConfig& config, std::size_t parameter_count) {
  const WorldOptions& world = config.world;
  std::string ranks = fmt::format("{} rank{}", world.ranks, world.ranks == 1 ? "" : "s");
  ranks += world.backend == "local" ? " (local threads)" : " (" + world.backend + ")";
  const std::string device = world.device == DeviceKind::kCpu ? "cpu" : "cuda";
  const std::string memory = world.device_memory == kUnlimitedCapacity
                                 ? "unlimited"
                                 : format_bytes(world.device_memory);
  std::string line = fmt::format(
      "zest-train: {}, {} ({} per rank), stage {}, {}, {} ({} params), {} lr {:.2e}, batch {} = "
      "{} x {} micro-batch{} x {} {}rank{}, {} steps",
      ranks, device, memory, config.engine.stage, dtype_name(config.engine.compute_dtype),
      describe_model(config.model), parameter_count, config.optimizer.type, config.optimizer.lr,
      config.train_batch_size, config.micro_batch, config.gradient_accumulation_steps,
      config.gradient_accumulation_steps == 1 ? "" : "es", config.pipeline.data_parallel,
      config.pipeline.enabled() || config.tensor_parallel.enabled() ? "data-parallel " : "",
      config.pipeline.data_parallel == 1 ? "" : "s", config.steps);
  if (config.tensor_parallel.enabled()) {
    line += fmt::format(", {} tensor-parallel ranks{}", config.tensor_parallel.size,
                        config.tensor_parallel.sequence_parallel ? " (sequence-parallel)" : "");
  }
  if (config.pipeline.enabled()) {
    line += fmt::format(", {} pipeline stages ({}{})", config.pipeline.stages,
                        schedule_kind_name(config.pipeline.schedule),
                        config.pipeline.virtual_chunks > 1
                            ? fmt::format(", {} chunks", config.pipeline.virtual_chunks)
                            : std::string());
  }
  if (config.engine.gradient_clipping > 0) {
    line += fmt::format(", clip {}", config.engine.gradient_clipping);
  }
  auto tier = [](const auto& offload) {
    return offload.device == OffloadDevice::kNvme ? "nvme" : "cpu";
  };
  if (config.engine.offload_optimizer.enabled()) {
    line += std::string(", optimizer offloaded to ") + tier(config.engine.offload_optimizer);
  }
  if (config.engine.offload_param.enabled()) {
    line += std::string(", parameters offloaded to ") + tier(config.engine.offload_param);
  }
  if (config.data.type != "synthetic") line += ", data " + config.data.path;
  return line;
}

std::array<std::uint64_t, kMemoryWords> pack_memory(const MemoryUsage& usage,
                                                    const MemoryPrediction& predicted,
                                                    std::size_t host_params) {
  std::array<std::uint64_t, kMemoryWords> words{};
  for (std::size_t c = 0; c < kCategoryCount; ++c) words[c] = usage.peak[c];
  words[kCategoryCount] = usage.total_peak;
  words[kCategoryCount + 1] = predicted.params;
  words[kCategoryCount + 2] = predicted.grads;
  words[kCategoryCount + 3] = predicted.optimizer;
  words[kCategoryCount + 4] = predicted.offload;
  words[kCategoryCount + 5] = predicted.host_params;
  words[kCategoryCount + 6] = host_params;
  return words;
}

void unpack_memory(const std::uint64_t* words, MemoryUsage& usage, MemoryPrediction& predicted,
                   std::size_t& host_params) {
  for (std::size_t c = 0; c < kCategoryCount; ++c) usage.peak[c] = words[c];
  usage.total_peak = words[kCategoryCount];
  predicted.params = words[kCategoryCount + 1];
  predicted.grads = words[kCategoryCount + 2];
  predicted.optimizer = words[kCategoryCount + 3];
  predicted.offload = words[kCategoryCount + 4];
  predicted.host_params = words[kCategoryCount + 5];
  host_params = words[kCategoryCount + 6];
}

std::size_t rank_host_params(Device& device) {
  return device.host_allocator().usage().peak_of(Category::kParams);
}

void print_host_params(const std::vector<std::size_t>& measured,
                       const std::vector<MemoryPrediction>& predicted) {
  std::string line;
  bool any = false;
  for (std::size_t rank = 0; rank < measured.size(); ++rank) {
    any = any || measured[rank] > 0 || predicted[rank].host_params > 0;
    line += fmt::format("{}rank {} {} (predicted {})", rank == 0 ? "" : ", ", rank,
                        format_bytes(measured[rank]), format_bytes(predicted[rank].host_params));
  }
  if (any) {
    Console::say("host params (offload_param's shards or NVMe buffers in the host arena): " + line);
  }
}

MemoryUsage rank_memory_usage(Device& device) {
  MemoryUsage usage = device.allocator().usage();
  // Nothing on the device is charged to `offload` or `snapshot`; the host arena's offloaded
  // optimizer and asynchronous checkpoint snapshots are.
  const MemoryUsage host = device.host_allocator().usage();
  for (Category category : all_categories()) {
    if (!in_host_memory(category)) continue;
    const auto c = static_cast<std::size_t>(category);
    usage.current[c] = host.current[c];
    usage.peak[c] = host.peak[c];
  }
  return usage;
}

void print_memory_table(const std::vector<MemoryUsage>& usage,
                        const std::vector<MemoryPrediction>& predicted,
                        const std::optional<PeakPrediction>& planned) {
  std::string header = fmt::format("{:>4}", "rank");
  for (Category category : all_categories()) {
    header += fmt::format(" {:>11}", category_name(category));
  }
  header += fmt::format(" {:>11} | {:>11} {:>11} {:>11} {:>11} {:>11}", "total", "params",
                        "grads", "optimizer", "total", "offload");
  // Note: `offload` and `snapshot` are host memory (the host arena), so neither total counts them.
  Console::say("peak bytes per rank (measured by the allocator | predicted model state; "
               "offload and snapshot are host memory, outside the totals)");
  Console::say(header);
  for (std::size_t rank = 0; rank < usage.size(); ++rank) {
    std::string line = fmt::format("{:>4}", rank);
    for (Category category : all_categories()) {
      line += fmt::format(" {:>11}", format_bytes(usage[rank].peak_of(category)));
    }
    const MemoryPrediction& p = predicted[rank];
    line += fmt::format(" {:>11} | {:>11} {:>11} {:>11} {:>11} {:>11}",
                        format_bytes(usage[rank].total_peak), format_bytes(p.params),
                        format_bytes(p.grads), format_bytes(p.optimizer), format_bytes(p.total()),
                        format_bytes(p.offload));
    Console::say(line);
  }
  if (!planned) return;
  std::string line = fmt::format("{:>4}", "plan");
  for (Category category : all_categories()) {
    line += fmt::format(" {:>11}", format_bytes(planned->of(category)));
  }
  Console::say(line + fmt::format(" {:>11} |  (zest-estimate --config; every rank)",
                                  format_bytes(planned->device_total)));
}

void print_summary(const RunSummary& summary) {
  std::string line = fmt::format(
      "zest-train: {} steps, loss {:.4f} -> {:.4f}, {:.0f} tokens/s, {:.1f} ms/step",
      summary.steps, summary.first_loss, summary.final_loss, summary.tokens_per_s,
      summary.mean_step_ms);
  if (summary.evaluated) line += fmt::format(", val_loss {:.4f}", summary.final_val_loss);
  Console::say(line);
}

nlohmann::ordered_json summary_record(const RunSummary& summary,
                                      const std::vector<MemoryUsage>& usage,
                                      const std::vector<MemoryPrediction>& predicted,
                                      const std::optional<PeakPrediction>& planned) {
  using ordered_json = nlohmann::ordered_json;
  ordered_json record;
  record["summary"] = {{"steps", summary.steps},
                       {"first_loss", shortest_json(summary.first_loss)},
                       {"final_loss", shortest_json(summary.final_loss)},
                       {"tokens_per_s", std::round(summary.tokens_per_s * 10.0) / 10.0},
                       {"step_ms", std::round(summary.mean_step_ms * 1000.0) / 1000.0}};
  if (summary.evaluated) record["summary"]["val_loss"] = shortest_json(summary.final_val_loss);
  if (summary.checkpoint_wait_s >= 0.0) {
    record["summary"]["checkpoint_wait_s"] = std::round(summary.checkpoint_wait_s * 1e6) / 1e6;
  }
  ordered_json peaks = ordered_json::array();
  ordered_json predictions = ordered_json::array();
  for (std::size_t rank = 0; rank < usage.size(); ++rank) {
    ordered_json peak = {{"rank", rank}};
    for (Category category : all_categories()) {
      peak[category_name(category)] = usage[rank].peak_of(category);
    }
    peak["total"] = usage[rank].total_peak;
    peaks.push_back(std::move(peak));
    const MemoryPrediction& p = predicted[rank];
    predictions.push_back({{"rank", rank},
                           {"params", p.params},
                           {"grads", p.grads},
                           {"optimizer", p.optimizer},
                           {"total", p.total()},
                           {"offload", p.offload}});
  }
  record["peak_bytes"] = std::move(peaks);
  record["predicted_model_state_bytes"] = std::move(predictions);
  if (planned) {
    ordered_json plan;
    for (Category category : all_categories()) plan[category_name(category)] = planned->of(category);
    plan["total"] = planned->device_total;
    record["planned_peak_bytes"] = std::move(plan);
  }
  return record;
}

void report_timeline(const TraceRecorder& trace, const TrainConfig& config, int ranks) {
  if (!config.trace_path.empty()) {
    trace.write(config.trace_path);
    Console::say("zest-train: trace written to " + config.trace_path +
                 " (open it in Perfetto or chrome://tracing)");
  }
  const auto overlap = trace.overlap(ranks);
  for (std::size_t rank = 0; rank < overlap.size(); ++rank) {
    if (overlap[rank].compute_ms == 0.0 && overlap[rank].comm_ms == 0.0) continue;
    Console::say(fmt::format(
        "rank {}: compute {:.1f} ms, comm {:.1f} ms, {:.0f}% of comm hidden under compute", rank,
        overlap[rank].compute_ms, overlap[rank].comm_ms, 100.0 * overlap[rank].hidden_fraction));
  }
}

}  // namespace zest
