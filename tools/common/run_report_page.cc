#include "tools/common/run_report_page.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

namespace zest {
namespace {

using ordered_json = nlohmann::ordered_json;
using nlohmann::json;

constexpr double kMiB = 1024.0 * 1024.0;

ordered_json point(double x, const std::optional<double>& y) {
  return ordered_json::array({x, y ? ordered_json(*y) : ordered_json(nullptr)});
}

// The indices of the steps a curve shows: all of them, or every n-th and the last.
std::vector<std::size_t> shown_steps(std::size_t count) {
  const std::size_t stride = count <= kMaxPointsPerCurve ? 1 : (count + kMaxPointsPerCurve - 1) /
                                                                    kMaxPointsPerCurve;
  std::vector<std::size_t> indices;
  for (std::size_t i = 0; i < count; i += stride) indices.push_back(i);
  if (!indices.empty() && indices.back() + 1 != count) indices.push_back(count - 1);
  return indices;
}

ordered_json line_dataset(const std::string& label, ordered_json data, std::size_t colour,
                          bool markers = false) {
  return {{"label", label},
          {"data", std::move(data)},
          {"borderColor", chart_colour(colour)},
          {"backgroundColor", chart_colour(colour)},
          {"borderWidth", 1.5},
          {"pointRadius", markers ? 3 : 0},
          {"spanGaps", false}};
}

ordered_json axis(const std::string& title, bool logarithmic = false) {
  return {{"type", logarithmic ? "logarithmic" : "linear"},
          {"title", {{"display", true}, {"text", title}}}};
}

ordered_json line_chart(ordered_json datasets, const std::string& x_title,
                        const std::string& y_title, bool log_y = false) {
  return {{"type", "line"},
          {"data", {{"datasets", std::move(datasets)}}},
          {"options",
           {{"interaction", {{"mode", "nearest"}, {"intersect", false}}},
            {"scales", {{"x", axis(x_title)}, {"y", axis(y_title, log_y)}}}}}};
}

std::string number_text(const json& value) {
  if (value.is_number_float()) return fmt::format("{:.6g}", value.get<double>());
  if (value.is_string()) return value.get<std::string>();
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The resolved config as rows of dotted key and value; arrays of scalars stay on one row.
void flatten(const json& value, const std::string& path,
             std::vector<std::vector<std::string>>& rows) {
  if (value.is_object() && !value.empty()) {
    for (const auto& item : value.items()) {
      flatten(item.value(), path.empty() ? item.key() : path + "." + item.key(), rows);
    }
    return;
  }
  rows.push_back({path, number_text(value)});
}

std::optional<double> config_number(const std::optional<json>& config, const json::json_pointer& at) {
  if (!config || !config->contains(at)) return std::nullopt;
  const json& value = config->at(at);
  if (!value.is_number()) return std::nullopt;
  return value.get<double>();
}

// Tokens seen per step, from the records (zest-train writes "tokens") or else the config.
std::optional<double> tokens_per_step(const RunReportInput& input) {
  for (const StepRecord& step : input.records.steps) {
    if (step.tokens) return static_cast<double>(*step.tokens) / static_cast<double>(step.step);
  }
  const auto batch = config_number(input.config, json::json_pointer("/train_batch_size"));
  if (!batch) return std::nullopt;
  const auto seq_len = config_number(input.config, json::json_pointer("/model/seq_len"));
  return *batch * (seq_len ? *seq_len : 1.0);
}

void loss_charts(HtmlPage& page, const RunReportInput& input) {
  const std::vector<StepRecord>& steps = input.records.steps;
  const std::vector<std::size_t> shown = shown_steps(steps.size());
  const std::optional<double> per_step = tokens_per_step(input);
  for (const bool by_tokens : {false, true}) {
    if (by_tokens && !per_step) {
      page.paragraph("Loss against tokens seen: not drawn, the records do not say how many tokens "
                     "a step takes (give the run's config: zest-report --config FILE).");
      continue;
    }
    auto x_of = [&](std::int64_t step) {
      return by_tokens ? static_cast<double>(step) * *per_step : static_cast<double>(step);
    };
    ordered_json loss = ordered_json::array();
    for (const std::size_t i : shown) loss.push_back(point(x_of(steps[i].step), steps[i].loss));
    ordered_json datasets = ordered_json::array({line_dataset("loss", std::move(loss), 0)});
    if (!input.records.evals.empty()) {
      ordered_json val = ordered_json::array();
      for (const EvalRecord& eval : input.records.evals) {
        val.push_back(point(x_of(eval.step), eval.val_loss));
      }
      datasets.push_back(line_dataset("validation loss", std::move(val), 1, true));
    }
    page.chart(by_tokens ? "Loss against tokens seen" : "Loss against step",
               line_chart(std::move(datasets), by_tokens ? "tokens seen" : "step", "loss"));
  }
}

void optimizer_charts(HtmlPage& page, const RunReportInput& input) {
  const std::vector<StepRecord>& steps = input.records.steps;
  const std::vector<std::size_t> shown = shown_steps(steps.size());
  const auto x = [&](std::size_t i) { return static_cast<double>(steps[i].step); };

  ordered_json lr = ordered_json::array();
  for (const std::size_t i : shown) lr.push_back(point(x(i), steps[i].lr));
  ordered_json lr_chart = line_chart(ordered_json::array({line_dataset("lr", std::move(lr), 2)}),
                                     "step", "learning rate");
  // From zero: a constant learning rate would otherwise sit on an axis centred on it.
  lr_chart["options"]["scales"]["y"]["beginAtZero"] = true;
  page.chart("Learning rate", std::move(lr_chart));

  ordered_json norm = ordered_json::array();
  for (const std::size_t i : shown) norm.push_back(point(x(i), steps[i].grad_norm));
  ordered_json datasets = ordered_json::array({line_dataset("gradient norm", std::move(norm), 3)});
  const auto clip = config_number(input.config, json::json_pointer("/gradient_clipping"));
  std::string caption = "Gradient norm (before clipping)";
  if (clip && *clip > 0) {
    ordered_json line = ordered_json::array(
        {point(x(0), *clip), point(x(steps.size() - 1), *clip)});
    ordered_json threshold = line_dataset("clipping threshold", std::move(line), 2);
    threshold["borderDash"] = {6, 4};
    datasets.push_back(std::move(threshold));
    const auto clipped = std::count_if(steps.begin(), steps.end(), [&](const StepRecord& step) {
      return step.grad_norm && *step.grad_norm > *clip;
    });
    caption += fmt::format(": {} of {} steps clipped at {:g}", clipped, steps.size(), *clip);
  }
  // Logarithmic: the early spikes of a run are tens of times the norm it settles at.
  page.chart(caption, line_chart(std::move(datasets), "step", "global L2 norm", true));

  const bool scaled = std::any_of(steps.begin(), steps.end(),
                                  [](const StepRecord& step) { return step.loss_scale.has_value(); });
  if (scaled) {
    ordered_json scale = ordered_json::array();
    for (const std::size_t i : shown) scale.push_back(point(x(i), steps[i].loss_scale));
    ordered_json skipped = ordered_json::array();
    std::size_t skipped_count = 0;
    for (const StepRecord& step : steps) {
      if (!step.skipped) continue;
      ++skipped_count;
      skipped.push_back(point(static_cast<double>(step.step), step.loss_scale));
    }
    ordered_json marks = line_dataset("skipped step", std::move(skipped), 2, true);
    marks["showLine"] = false;
    marks["pointStyle"] = "crossRot";
    marks["pointRadius"] = 6;
    page.chart(fmt::format("Loss scale (fp16): {} skipped step{}", skipped_count,
                           skipped_count == 1 ? "" : "s"),
               line_chart(ordered_json::array({line_dataset("loss scale", std::move(scale), 4),
                                               std::move(marks)}),
                          "step", "loss scale", true));
  }

  ordered_json rate = ordered_json::array();
  ordered_json time = ordered_json::array();
  for (const std::size_t i : shown) {
    rate.push_back(point(x(i), steps[i].tokens_per_s));
    time.push_back(point(x(i), steps[i].step_ms));
  }
  ordered_json throughput = line_chart(
      ordered_json::array({line_dataset("tokens/s (mean so far)", std::move(rate), 0),
                           line_dataset("step time (ms)", std::move(time), 1)}),
      "step", "tokens/s");
  throughput["data"]["datasets"][1]["yAxisID"] = "y1";
  throughput["options"]["scales"]["y1"] = axis("ms per step");
  throughput["options"]["scales"]["y1"]["position"] = "right";
  throughput["options"]["scales"]["y1"]["grid"] = {{"drawOnChartArea", false}};
  page.chart("Throughput and step time", std::move(throughput));
  if (!scaled) page.paragraph("No loss scaling in this run (fp16 is off), so no loss-scale chart.");
}

// Bytes on the wire per step: rank 0's, inside its node and across nodes, as the ring model of
// runtime/link_model.h counts them (each rank of a group counts the group's average share). A
// table, not a chart: with no link model a run's bytes are the same every step. Records from
// before zest counted them have none: no section.
void wire_section(HtmlPage& page, const RunReportInput& input) {
  std::vector<const StepRecord*> counted;
  for (const StepRecord& step : input.records.steps) {
    if (step.intra_node_bytes && step.inter_node_bytes) counted.push_back(&step);
  }
  if (counted.empty()) return;
  double intra_sum = 0.0, inter_sum = 0.0;
  for (const StepRecord* step : counted) {
    intra_sum += *step->intra_node_bytes;
    inter_sum += *step->inter_node_bytes;
  }
  const auto mib = [](double bytes) { return fmt::format("{:.3f}", bytes / kMiB); };
  const auto row = [&](const std::string& what, const StepRecord& step) {
    return std::vector<std::string>{what, mib(*step.intra_node_bytes), mib(*step.inter_node_bytes),
                                    mib(*step.intra_node_bytes + *step.inter_node_bytes)};
  };
  page.heading("Bytes on the wire");
  page.paragraph("What rank 0 sent per step, inside its node and across nodes (world.ranks_per_node), "
                 "as a ring sends it: all-reduce 2(n-1)/n of the buffer, reduce-scatter and "
                 "all-gather (n-1)/n.");
  const double n = static_cast<double>(counted.size());
  page.table({"step", "inside the node (MiB)", "across nodes (MiB)", "in all (MiB)"},
             {row("first (" + std::to_string(counted.front()->step) + ")", *counted.front()),
              {"mean of " + std::to_string(counted.size()), mib(intra_sum / n), mib(inter_sum / n),
               mib((intra_sum + inter_sum) / n)},
              row("last (" + std::to_string(counted.back()->step) + ")", *counted.back())});
}

// The device categories of a peak record, in the order written: without the rank, the total
// and the host arena's (offload, snapshot).
std::vector<std::string> categories_of(const json& peak) {
  std::vector<std::string> names;
  for (const auto& item : peak.items()) {
    if (item.key() != "rank" && item.key() != "total" && item.key() != "offload" &&
        item.key() != "snapshot") {
      names.push_back(item.key());
    }
  }
  return names;
}

std::uint64_t bytes_in(const json& record, const std::string& key) {
  const auto it = record.find(key);
  return it != record.end() && it->is_number_unsigned() ? it->get<std::uint64_t>() : 0;
}

void memory_section(HtmlPage& page, const RunReportInput& input) {
  page.heading("Memory");
  const std::optional<json>& summary = input.records.summary;
  const auto peaks = summary ? summary->find("peak_bytes") : json::const_iterator();
  if (!summary || peaks == summary->end() || !peaks->is_array() || peaks->empty() ||
      !(*peaks)[0].is_object()) {
    page.paragraph("No memory record: the run ended before its summary (it was killed, or is "
                   "still running), and the peaks are written there.");
    return;
  }
  const std::vector<std::string> categories = categories_of((*peaks)[0]);
  const auto planned = summary->find("planned_peak_bytes");
  const bool has_plan = planned != summary->end() && planned->is_object();
  ordered_json labels = ordered_json::array();
  for (std::size_t rank = 0; rank < peaks->size(); ++rank) labels.push_back(fmt::format("rank {}", rank));
  if (has_plan) labels.push_back("plan");
  ordered_json datasets = ordered_json::array();
  for (std::size_t c = 0; c < categories.size(); ++c) {
    ordered_json values = ordered_json::array();
    for (const json& peak : *peaks) values.push_back(bytes_in(peak, categories[c]) / kMiB);
    if (has_plan) values.push_back(bytes_in(*planned, categories[c]) / kMiB);
    datasets.push_back({{"label", categories[c]},
                        {"data", std::move(values)},
                        {"backgroundColor", chart_colour(c)},
                        {"stack", "peak"}});
  }
  ordered_json config = {
      {"type", "bar"},
      {"data", {{"labels", std::move(labels)}, {"datasets", std::move(datasets)}}},
      {"options",
       {{"scales",
         {{"x", {{"stacked", true}}},
          {"y", {{"stacked", true}, {"title", {{"display", true}, {"text", "MiB"}}}}}}}}}};
  page.chart(has_plan ? "Peak device memory per rank by category, beside the planner's prediction"
                      : "Peak device memory per rank by category",
             std::move(config));
  // Note: each category's peak is its own maximum, reached at its own moment, so a stack can
  // stand above the device's total peak; the table gives that total.
  std::vector<std::vector<std::string>> rows;
  const auto predicted = summary->find("predicted_model_state_bytes");
  for (std::size_t rank = 0; rank < peaks->size(); ++rank) {
    const json& peak = (*peaks)[rank];
    std::string model_state = "-";
    std::string offload = fmt::format("{:.2f}", bytes_in(peak, "offload") / kMiB);
    std::string snapshot = fmt::format("{:.2f}", bytes_in(peak, "snapshot") / kMiB);
    if (predicted != summary->end() && predicted->is_array() && rank < predicted->size()) {
      model_state = fmt::format("{:.2f}", bytes_in((*predicted)[rank], "total") / kMiB);
    }
    rows.push_back({fmt::format("rank {}", rank),
                    fmt::format("{:.2f}", bytes_in(peak, "total") / kMiB), model_state, offload,
                    snapshot});
  }
  if (has_plan) {
    rows.push_back({"plan", fmt::format("{:.2f}", bytes_in(*planned, "total") / kMiB), "-",
                    fmt::format("{:.2f}", bytes_in(*planned, "offload") / kMiB),
                    fmt::format("{:.2f}", bytes_in(*planned, "snapshot") / kMiB)});
  }
  page.table({"", "device total peak (MiB)", "predicted model state (MiB)",
              "offloaded, host (MiB)", "checkpoint snapshots, host (MiB)"},
             rows, true);
  page.paragraph("Each category's bar is that category's own peak; they need not all peak at "
                 "the same moment, so a stack may stand above the device total.");
}

void timeline_section(HtmlPage& page, const RunReportInput& input) {
  page.heading("Communication hidden behind compute");
  if (input.overlap.empty()) {
    page.paragraph(input.timeline_note);
    return;
  }
  ordered_json labels = ordered_json::array();
  ordered_json hidden = ordered_json::array();
  ordered_json exposed = ordered_json::array();
  std::vector<std::vector<std::string>> rows;
  for (std::size_t rank = 0; rank < input.overlap.size(); ++rank) {
    const TraceRecorder::Overlap& o = input.overlap[rank];
    // With ranks as processes, a trace holds only its own process's ranks.
    if (o.compute_ms == 0.0 && o.comm_ms == 0.0) continue;
    labels.push_back(fmt::format("rank {}", rank));
    hidden.push_back(o.comm_ms * o.hidden_fraction);
    exposed.push_back(o.comm_ms * (1.0 - o.hidden_fraction));
    rows.push_back({fmt::format("rank {}", rank), fmt::format("{:.1f}", o.compute_ms),
                    fmt::format("{:.1f}", o.comm_ms),
                    fmt::format("{:.0f}%", 100.0 * o.hidden_fraction)});
  }
  ordered_json config = {
      {"type", "bar"},
      {"data",
       {{"labels", std::move(labels)},
        {"datasets",
         ordered_json::array({{{"label", "communication under compute"},
                               {"data", std::move(hidden)},
                               {"backgroundColor", chart_colour(4)}},
                              {{"label", "communication exposed"},
                               {"data", std::move(exposed)},
                               {"backgroundColor", chart_colour(2)}}})}}},
      {"options",
       {{"scales",
         {{"x", {{"stacked", true}}},
          {"y", {{"stacked", true}, {"title", {{"display", true}, {"text", "ms"}}}}}}}}}};
  if (rows.empty()) {
    page.paragraph("The trace holds no compute or communication.");
    return;
  }
  page.chart("Communication time per rank: hidden under compute and exposed", std::move(config));
  page.table({"", "compute (ms)", "communication (ms)", "hidden under compute"}, rows, true);
}

void summary_table(HtmlPage& page, const RunReportInput& input) {
  const RunRecords& records = input.records;
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"steps recorded", fmt::format("{} ({} to {})", records.steps.size(),
                                                records.steps.front().step,
                                                records.steps.back().step)});
  if (records.summary) {
    for (const auto& item : records.summary->at("summary").items()) {
      rows.push_back({item.key(), number_text(item.value())});
    }
  } else {
    rows.push_back({"summary", "none: the run ended before writing it (killed, or still running)"});
  }
  if (!input.ending.empty()) rows.push_back({"ended", input.ending});
  page.table({"run", "value"}, rows);
}

}  // namespace

HtmlPage run_report_page(const RunReportInput& input) {
  HtmlPage page("zest run report", input.description);
  summary_table(page, input);
  page.heading("Loss");
  loss_charts(page, input);
  page.heading("Optimizer and throughput");
  optimizer_charts(page, input);
  wire_section(page, input);
  memory_section(page, input);
  timeline_section(page, input);
  page.heading("Resolved config");
  if (!input.config) {
    page.paragraph("Not given (zest-report --config FILE shows it).");
  } else {
    std::vector<std::vector<std::string>> rows;
    flatten(*input.config, "", rows);
    page.table({"key", "value"}, rows);
  }
  return page;
}

}  // namespace zest
