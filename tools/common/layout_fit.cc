#include "tools/common/layout_fit.h"

#include <algorithm>
#include <iostream>
#include <tuple>

#include <fmt/format.h>

#include "base/byte_size.h"
#include "base/error.h"
#include "resolve/resolved_config.h"
#include "tools/common/memory_estimate.h"

namespace zest {

namespace {

// The config as layout (p, t): the same global batch and micro-batch, the accumulation (or the
// pipeline's micro-batches) derived again for the new data-parallel ranks.
nlohmann::json with_layout(nlohmann::json config, std::int64_t global_batch,
                           std::int64_t micro_batch, int pipeline_stages, int tensor_parallel) {
  config["train_batch_size"] = global_batch;
  config["train_micro_batch_size_per_gpu"] = micro_batch;
  config.erase("gradient_accumulation_steps");
  if (pipeline_stages == 1) {
    config.erase("pipeline");
  } else {
    nlohmann::json& pipeline = config["pipeline"];
    pipeline["stages"] = pipeline_stages;
    pipeline.erase("micro_batches");
  }
  if (tensor_parallel == 1) {
    config.erase("tensor_parallel");
  } else {
    config["tensor_parallel"]["size"] = tensor_parallel;
    config["tensor_parallel"].erase("autotp_size");
  }
  return config;
}

std::size_t largest_peak(const TrainConfig& config) {
  const EstimateJob job = job_from_config(config);
  if (!config.pipeline.enabled()) return predict_peak(job.input).device_total;
  const PipelineEstimate estimate = pipeline_estimate(config, job);
  return estimate.pipeline_stages[estimate.largest()].peak.device_total;
}

}  // namespace

std::vector<LayoutFit> fit_layouts(const nlohmann::json& config, std::size_t capacity) {
  const TrainConfig given = parse_resolved_config(config);
  const int ranks = given.world.ranks;
  std::vector<LayoutFit> layouts;
  for (int p = 1; p <= ranks; ++p) {
    for (int t = 1; p * t <= ranks; ++t) {
      if (ranks % (p * t) != 0) continue;
      std::optional<TrainConfig> layout;
      try {
        layout = parse_resolved_config(
            with_layout(config, given.train_batch_size, given.micro_batch, p, t));
      } catch (const Error& error) {
        if (error.kind() != ErrorKind::kConfig) throw;
        continue;  // a layout the model or the config cannot take
      }
      LayoutFit fit;
      fit.pipeline_stages = p;
      fit.tensor_parallel = t;
      fit.data_parallel = ranks / (p * t);
      fit.peak = largest_peak(*layout);
      fit.fits = fit.peak <= capacity;
      const int per_node = layout->world.ranks_per_node;
      fit.tensor_group_crosses_nodes = per_node > 0 && per_node % t != 0;
      layouts.push_back(fit);
    }
  }
  return layouts;
}

std::optional<LayoutFit> proposed_layout(const std::vector<LayoutFit>& layouts) {
  std::optional<LayoutFit> best;
  for (const LayoutFit& layout : layouts) {
    if (!layout.fits) continue;
    const auto key = [](const LayoutFit& l) {
      return std::make_tuple(l.tensor_group_crosses_nodes, l.pipeline_stages, l.tensor_parallel,
                             l.peak);
    };
    if (!best || key(layout) < key(*best)) best = layout;
  }
  return best;
}

void print_layouts(const std::vector<LayoutFit>& layouts, std::size_t capacity, int ranks) {
  std::cout << fmt::format(
      "layouts of the {} ranks (pipeline stages x tensor-parallel x data-parallel), the largest "
      "rank's peak against {}:\n",
      ranks, format_bytes(capacity));
  for (const LayoutFit& layout : layouts) {
    std::cout << fmt::format(
        "  {} x {} x {}  {:>11}  {}{}\n", layout.pipeline_stages, layout.tensor_parallel,
        layout.data_parallel, format_bytes(layout.peak), layout.fits ? "fits" : "does not fit",
        layout.tensor_group_crosses_nodes ? " (a tensor-parallel group would cross nodes)" : "");
  }
  const std::optional<LayoutFit> proposed = proposed_layout(layouts);
  if (!proposed) {
    std::cout << "proposed layout: none of them fits\n";
    return;
  }
  std::cout << fmt::format(
      "proposed layout: {} x {} x {} (of those that fit, tensor-parallel ranks inside a node "
      "first, then pipeline stages): pipeline.stages {}, tensor_parallel.size {}\n",
      proposed->pipeline_stages, proposed->tensor_parallel, proposed->data_parallel,
      proposed->pipeline_stages, proposed->tensor_parallel);
}

nlohmann::ordered_json layouts_json(const std::vector<LayoutFit>& layouts) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  const std::optional<LayoutFit> proposed = proposed_layout(layouts);
  for (const LayoutFit& layout : layouts) {
    const bool chosen = proposed && proposed->pipeline_stages == layout.pipeline_stages &&
                        proposed->tensor_parallel == layout.tensor_parallel;
    out.push_back({{"pipeline_stages", layout.pipeline_stages},
                   {"tensor_parallel", layout.tensor_parallel},
                   {"data_parallel", layout.data_parallel},
                   {"peak_bytes", layout.peak},
                   {"fits", layout.fits},
                   {"tensor_group_crosses_nodes", layout.tensor_group_crosses_nodes},
                   {"proposed", chosen}});
  }
  return out;
}

}  // namespace zest
