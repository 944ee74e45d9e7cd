#include "tools/estimate/estimate_page.h"

#include <fmt/format.h>

#include "base/byte_size.h"
#include "base/error.h"
#include "engine/recompute.h"
#include "engine/stage_plan.h"
#include "memory/allocator.h"

namespace zest {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr double kMiB = 1024.0 * 1024.0;

// --fit's n_layer search is repeated under each activation_checkpointing policy, in this order.
constexpr RecomputePolicy kFitPolicies[] = {RecomputePolicy::kNone, RecomputePolicy::kSelective,
                                            RecomputePolicy::kFull};

// The device's categories: `offload` and `snapshot` are host memory, shown in the table instead.
std::vector<Category> device_categories() {
  std::vector<Category> categories;
  for (Category category : all_categories()) {
    if (!in_host_memory(category)) categories.push_back(category);
  }
  return categories;
}

// Stacked bars, one per label, each the per-category peaks of one prediction (none: an empty
// bar), with the device total of each and the device's capacity.
ordered_json stack_chart(const std::vector<std::string>& labels,
                         const std::vector<const PeakPrediction*>& predictions,
                         std::size_t capacity) {
  ordered_json datasets = ordered_json::array();
  const std::vector<Category> categories = device_categories();
  for (std::size_t c = 0; c < categories.size(); ++c) {
    ordered_json values = ordered_json::array();
    for (const PeakPrediction* prediction : predictions) {
      values.push_back(prediction ? ordered_json(prediction->of(categories[c]) / kMiB)
                                  : ordered_json(nullptr));
    }
    datasets.push_back({{"label", category_name(categories[c])},
                        {"data", std::move(values)},
                        {"backgroundColor", chart_colour(c)},
                        {"stack", "plan"},
                        {"order", 2}});
  }
  // Note: the y axis stacks every dataset with the same `stack`, lines too, so the total and
  // the capacity each get a stack of their own.
  ordered_json totals = ordered_json::array();
  for (const PeakPrediction* prediction : predictions) {
    totals.push_back(prediction ? ordered_json(prediction->device_total / kMiB)
                                : ordered_json(nullptr));
  }
  if (labels.size() == 1) {
    // One bar: the total and the capacity are bars beside it (a line needs two points).
    datasets.push_back({{"label", "device total (the peak of the sum)"},
                        {"data", std::move(totals)},
                        {"backgroundColor", "#555"},
                        {"stack", "total"}});
    if (capacity != kUnlimitedCapacity) {
      datasets.push_back({{"label", "device capacity"},
                          {"data", ordered_json::array({capacity / kMiB})},
                          {"backgroundColor", "rgba(0,0,0,0.12)"},
                          {"borderColor", "#555"},
                          {"borderWidth", 2},
                          {"stack", "capacity"}});
    }
  } else {
    datasets.push_back({{"type", "line"},
                        {"label", "device total (the peak of the sum)"},
                        {"data", std::move(totals)},
                        {"showLine", false},
                        {"pointStyle", "line"},
                        {"pointRadius", 24},
                        {"pointBorderWidth", 3},
                        {"borderColor", "#222"},
                        {"backgroundColor", "#222"},
                        {"stack", "total"},
                        {"order", 1}});
    if (capacity != kUnlimitedCapacity) {
      ordered_json line = ordered_json::array();
      for (std::size_t i = 0; i < labels.size(); ++i) line.push_back(capacity / kMiB);
      datasets.push_back({{"type", "line"},
                          {"label", "device capacity"},
                          {"data", std::move(line)},
                          {"borderColor", "#555"},
                          {"borderDash", {6, 4}},
                          {"borderWidth", 2},
                          {"pointRadius", 0},
                          {"stack", "capacity"},
                          {"order", 0}});
    }
  }
  return {{"type", "bar"},
          {"data", {{"labels", labels}, {"datasets", std::move(datasets)}}},
          {"options",
           {{"scales",
             {{"x", {{"stacked", true}}},
              {"y",
               {{"stacked", true},
                {"beginAtZero", true},
                {"title", {{"display", true}, {"text", "MiB per rank"}}}}}}}}}};
}

std::string verdict(const PeakPrediction& prediction, std::size_t capacity) {
  if (capacity == kUnlimitedCapacity) return "no device capacity given";
  return fmt::format("{} in {} ({:.0f}% used)",
                     prediction.device_total <= capacity ? "fits" : "does not fit",
                     format_bytes(capacity),
                     100.0 * static_cast<double>(prediction.device_total) /
                         static_cast<double>(capacity));
}

}  // namespace

std::vector<StageEstimate> plan_every_stage(const EstimateJob& job) {
  std::vector<StageEstimate> plans;
  for (int stage = 0; stage < StagePlan::kStages; ++stage) {
    StageEstimate plan;
    plan.stage = stage;
    PeakPlanInput input = job.input;
    input.engine.stage = stage;
    try {
      plan.prediction = predict_peak(input);
    } catch (const Error& error) {
      plan.refused = error.what();
    }
    plans.push_back(std::move(plan));
  }
  return plans;
}

HtmlPage estimate_page(const EstimateJob& job, const PeakPrediction& prediction,
                       std::size_t capacity, const std::vector<StageEstimate>& stages,
                       const std::vector<StageFit>& fits, bool parameter_mode) {
  HtmlPage page("zest memory plan", job.description);
  const int stage = job.input.engine.stage;
  page.heading(fmt::format("Stage {}: {}", stage, verdict(prediction, capacity)));
  page.chart(fmt::format("Peak bytes per rank by category at stage {} ({})", stage,
                         planned_ranks(job)),
             stack_chart({fmt::format("stage {}", stage)}, {&prediction}, capacity));
  std::vector<std::vector<std::string>> rows;
  for (Category category : all_categories()) {
    const std::string name = in_host_memory(category)
                                 ? std::string(category_name(category)) + " (host)"
                                 : std::string(category_name(category));
    rows.push_back({name, format_bytes(prediction.of(category)),
                    std::to_string(prediction.of(category))});
  }
  rows.push_back({"device total", format_bytes(prediction.device_total),
                  std::to_string(prediction.device_total)});
  if (capacity != kUnlimitedCapacity) {
    rows.push_back({"device capacity", format_bytes(capacity), std::to_string(capacity)});
  }
  page.table({"category", "peak per rank", "bytes"}, rows, true);

  if (stages.empty()) {
    page.paragraph("Every stage side by side: zest-estimate --fit --html FILE.");
    return page;
  }
  page.heading("Every ZeRO stage against the device's capacity");
  std::vector<std::string> labels;
  std::vector<const PeakPrediction*> predictions;
  for (const StageEstimate& plan : stages) {
    labels.push_back(fmt::format("stage {}", plan.stage));
    predictions.push_back(plan.prediction ? &*plan.prediction : nullptr);
  }
  page.chart("The same job at each stage: peak bytes per rank by category",
             stack_chart(labels, predictions, capacity));
  std::vector<std::vector<std::string>> fit_rows;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const StageEstimate& plan = stages[i];
    std::vector<std::string> row = {fmt::format("stage {}", plan.stage),
                                    plan.prediction ? verdict(*plan.prediction, capacity)
                                                    : "refused: " + plan.refused};
    auto shown = [](const auto& value) {
      return value ? std::to_string(*value) : std::string("none");
    };
    const StageFit* fit = nullptr;
    for (const StageFit& candidate : fits) {
      if (candidate.stage == plan.stage) fit = &candidate;
    }
    if (parameter_mode) {
      row.push_back(fit ? shown(fit->parameters) : "-");
    } else {
      row.push_back(fit ? shown(fit->n_layer) : "-");
      row.push_back(fit ? shown(fit->n_embd) : "-");
      // The same n_layer search under each activation_checkpointing policy, in the order
      // zest-estimate's text names them (none, selective, full).
      for (const RecomputePolicy policy : kFitPolicies) {
        std::string cell = "-";
        if (fit) {
          for (const auto& [tried, layers] : fit->n_layer_by_policy) {
            if (tried == policy) cell = shown(layers);
          }
        }
        row.push_back(cell);
      }
    }
    fit_rows.push_back(std::move(row));
  }
  if (parameter_mode) {
    page.table({"stage", "this job", "largest parameter count that fits"}, fit_rows);
  } else {
    std::vector<std::string> header = {"stage", "this job",
                                       "largest n_layer that fits (at its n_embd)",
                                       "largest n_embd that fits (at its n_layer)"};
    for (const RecomputePolicy policy : kFitPolicies) {
      header.push_back(fmt::format("n_layer with recomputation \"{}\"",
                                   recompute_policy_name(policy)));
    }
    page.table(header, fit_rows);
  }
  return page;
}

}  // namespace zest
