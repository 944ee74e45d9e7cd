#include "tools/estimate/pipeline_report.h"

#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/byte_size.h"
#include "memory/allocator.h"
#include "tools/estimate/estimate_report.h"

namespace zest {
namespace {

// "embedding..block1" per chunk, chunks joined by ", ".
std::string stage_units(const PipelineEstimate& estimate, const PipelineStagePeak& planned) {
  std::string text;
  const std::vector<std::size_t>& units = planned.units;
  for (std::size_t i = 0; i < units.size();) {
    std::size_t j = i;
    while (j + 1 < units.size() && units[j + 1] == units[j] + 1) ++j;
    text += (text.empty() ? "" : ", ") + estimate.unit_names[units[i]];
    if (j > i) text += ".." + estimate.unit_names[units[j]];
    i = j + 1;
  }
  for (std::size_t copy : planned.tied_copies) {
    text += " (+ a copy of " + estimate.unit_names[copy] + ", tied)";
  }
  return text;
}

std::string verdict(const PipelineEstimate& estimate, std::size_t capacity) {
  if (capacity == kUnlimitedCapacity) {
    return "no device capacity given (--device-memory or world.device_memory)";
  }
  const PipelineStagePeak& largest = estimate.pipeline_stages[estimate.largest()];
  const bool fits = largest.peak.device_total <= capacity;
  return fmt::format(
      "{} in {} per rank (the largest, pipeline stage {}, uses {:.0f}%)",
      fits ? "fits" : "does not fit", format_bytes(capacity), largest.pipeline_stage,
      100.0 * static_cast<double>(largest.peak.device_total) / static_cast<double>(capacity));
}

}  // namespace

void print_pipeline_estimate(const EstimateJob& job, const PipelineEstimate& estimate,
                             std::size_t capacity) {
  std::cout << "zest-estimate: " << job.description << "\n";
  const Schedule& schedule = estimate.schedule;
  std::string in_flight;
  for (const StageTimeline& timeline : estimate.simulation.pipeline_stages) {
    in_flight += (in_flight.empty() ? "" : ", ") + std::to_string(timeline.peak_in_flight);
  }
  std::cout << fmt::format(
      "schedule {}: bubble {:.4f} of the compute simulated, {:.4f} by the closed formula; idle "
      "{:.1f}% of the step; micro-batches in flight per pipeline stage: {}\n",
      schedule.name, estimate.simulation.bubble_ratio, estimate.closed_form_bubble_ratio,
      100.0 * estimate.simulation.idle_fraction, in_flight);
  const int tensor = job.input.tensor_parallel_size;
  const std::string ranks =
      tensor > 1 ? fmt::format("the largest of its {} data-parallel x {} tensor-parallel ranks",
                               estimate.data_parallel, tensor)
                 : fmt::format("each of its {} data-parallel rank{} holds the same",
                               estimate.data_parallel, estimate.data_parallel == 1 ? "" : "s");
  std::cout << fmt::format("peak bytes per rank of each pipeline stage ({}):\n", ranks);
  for (const PipelineStagePeak& planned : estimate.pipeline_stages) {
    std::cout << fmt::format("pipeline stage {}: {}; {} micro-batch{} in flight\n",
                             planned.pipeline_stage, stage_units(estimate, planned),
                             planned.peak_in_flight, planned.peak_in_flight == 1 ? "" : "es");
    for (Category category : all_categories()) {
      if (in_host_memory(category)) continue;
      std::cout << fmt::format("  {:<14}{:>16}  {:>11}\n", category_name(category),
                               planned.peak.of(category), format_bytes(planned.peak.of(category)));
    }
    std::cout << fmt::format("  {:<14}{:>16}  {:>11}\n", "device total", planned.peak.device_total,
                             format_bytes(planned.peak.device_total));
    std::cout << fmt::format("  {:<14}{:>16}  {:>11}\n", "host (offload)",
                             planned.peak.host_total(), format_bytes(planned.peak.host_total()));
    std::string parts = fmt::format("activations in flight {}, received gradients {}",
                                    format_bytes(planned.in_flight_activations),
                                    format_bytes(planned.received_gradients));
    if (planned.gathered_for_step > 0) {
      parts +=
          fmt::format(", units gathered for the step {}", format_bytes(planned.gathered_for_step));
    }
    std::cout << "  of which: " << parts << "\n";
  }
  std::cout << "verdict: " << verdict(estimate, capacity) << "\n";
}

nlohmann::ordered_json pipeline_json(const PipelineEstimate& estimate, std::size_t capacity) {
  nlohmann::ordered_json out;
  const Schedule& schedule = estimate.schedule;
  out["stages"] = schedule.pipeline_stages;
  out["data_parallel"] = estimate.data_parallel;
  out["micro_batches"] = schedule.micro_batches;
  out["virtual_chunks"] = schedule.chunks;
  out["schedule"] = schedule.name;
  out["bubble_ratio"] = estimate.simulation.bubble_ratio;
  out["closed_form_bubble_ratio"] = estimate.closed_form_bubble_ratio;
  out["idle_fraction"] = estimate.simulation.idle_fraction;
  out["reshard_after_forward"] = estimate.reshard_after_forward;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const PipelineStagePeak& planned : estimate.pipeline_stages) {
    nlohmann::ordered_json row;
    row["stage"] = planned.pipeline_stage;
    nlohmann::ordered_json units = nlohmann::ordered_json::array();
    for (std::size_t unit : planned.units) units.push_back(estimate.unit_names[unit]);
    row["units"] = std::move(units);
    nlohmann::ordered_json copies = nlohmann::ordered_json::array();
    for (std::size_t unit : planned.tied_copies) copies.push_back(estimate.unit_names[unit]);
    row["tied_copies"] = std::move(copies);
    row["peak_in_flight"] = planned.peak_in_flight;
    nlohmann::ordered_json per_rank;
    for (Category category : all_categories())
      per_rank[category_name(category)] = planned.peak.of(category);
    per_rank["device_total"] = planned.peak.device_total;
    per_rank["host_total"] = planned.peak.host_total();
    per_rank["host"] = tier_json(planned.peak.host_peak, planned.peak.host_total());
    row["per_rank_bytes"] = std::move(per_rank);
    row["in_flight_activations"] = planned.in_flight_activations;
    row["received_activations"] = planned.received_activations;
    row["received_gradients"] = planned.received_gradients;
    row["gathered_for_step"] = planned.gathered_for_step;
    row["fits"] = capacity == kUnlimitedCapacity
                      ? nlohmann::ordered_json(nullptr)
                      : nlohmann::ordered_json(planned.peak.device_total <= capacity);
    rows.push_back(std::move(row));
  }
  out["per_stage"] = std::move(rows);
  out["largest_stage"] = estimate.pipeline_stages[estimate.largest()].pipeline_stage;
  return out;
}

}  // namespace zest
