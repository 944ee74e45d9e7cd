// zest-estimate: the memory planner (planner/peak_plan.h) from the command line. Prints, per rank,
// the peak bytes of every category a training config will reach, the verdict against a device
// capacity with the smallest change that fits, and with --fit the first offload that fits the
// device, host and NVMe tiers (tools/common/offload_fit.h) and the largest GPT (or parameter
// count) that fits each stage on the world size; with --html the same as a picture
// (tools/estimate/estimate_page.h).
//
//   zest-estimate --config FILE [--set dotted.key=value ...] [--device-memory SIZE]
//                 [--host-memory SIZE] [--fit [--nvme PATH|SIZE]] [--json] [--html FILE]
//   zest-estimate --params N --world N --stage S [--dtype fp32|bf16|fp16] [--offload]
//                 [--offload-param] [--device-memory SIZE] [--host-memory SIZE]
//                 [--fit [--nvme PATH|SIZE]] [--json] [--html FILE]
//
// The config is read and validated as zest-train reads it, and the model is built through the
// same factory (units declare shapes; no weights are allocated). --params plans the model state
// only. Errors print one line, "zest-estimate: error: <message>", and exit 2 for bad input, 1
// for failures at run time.
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/byte_size.h"
#include "base/error.h"
#include "base/file_checks.h"
#include "resolve/resolved_config.h"
#include "tools/common/layout_fit.h"
#include "tools/common/memory_estimate.h"
#include "tools/common/model_size.h"
#include "tools/common/tool_main.h"
#include "tools/common/html_page.h"
#include "tools/estimate/estimate_page.h"
#include "tools/estimate/estimate_report.h"
#include "tools/estimate/pipeline_report.h"

namespace {

constexpr const char* kProgram = "zest-estimate";

zest::DType parse_dtype(const std::string& name) {
  if (name == "fp32") return zest::DType::kFloat32;
  if (name == "bf16") return zest::DType::kBFloat16;
  if (name == "fp16") return zest::DType::kFloat16;
  throw zest::Error(zest::ErrorKind::kUsage, "--dtype: must be fp32, bf16 or fp16, got \"" + name + "\"");
}

std::size_t parse_capacity(const std::string& text, std::size_t fallback,
                           const std::string& option = "--device-memory") {
  if (text.empty()) return fallback;
  const auto bytes = zest::parse_byte_size(text);
  if (!bytes || *bytes == 0) {
    throw zest::Error(zest::ErrorKind::kUsage, option + ": must be " + zest::kByteSizeForms +
                                                   ", got \"" + text + "\"");
  }
  return *bytes;
}

struct Options {
  std::string config_path;
  std::vector<std::string> overrides;
  zest::BareModel bare;
  std::string dtype = "fp32";
  std::string device_memory;
  std::string host_memory;
  std::string nvme_path;
  bool fit = false;
  bool json = false;
  std::string html_path;
};

// --fit's other layouts of the config's ranks (tools/common/layout_fit.h): its JSON, the
// overrides applied, rearranged as each (pipeline stages, tensor-parallel, data-parallel).
std::vector<zest::LayoutFit> layouts_of(const Options& options, std::size_t capacity) {
  nlohmann::json raw = zest::read_json_file(options.config_path);
  for (const std::string& assignment : options.overrides) zest::apply_override(raw, assignment);
  return zest::fit_layouts(raw, capacity);
}

// A config with pipeline stages: each pipeline stage's plan and the schedule's bubble. The
// top-level numbers of --json are the largest pipeline stage's.
int estimate_pipeline(const Options& options, const zest::TrainConfig& config,
                      const zest::EstimateJob& job, std::size_t capacity) {
  std::vector<zest::StageFit> fits;
  std::vector<zest::LayoutFit> layouts;
  if (options.fit) {
    if (capacity == zest::kUnlimitedCapacity) {
      throw zest::Error(zest::ErrorKind::kUsage,
                        "--fit: needs a device capacity (--device-memory, or world.device_memory)");
    }
    fits = zest::fit_pipeline(config, capacity, config.world.host_memory);
    layouts = layouts_of(options, capacity);
  }
  if (!options.html_path.empty()) {
    throw zest::Error(zest::ErrorKind::kUsage,
                      "--html: not with pipeline stages yet (pipeline.stages " +
                          std::to_string(config.pipeline.stages) + "); drop --html");
  }
  const zest::PipelineEstimate estimate = zest::pipeline_estimate(config, job);
  if (options.json) {
    const zest::PipelineStagePeak& largest = estimate.pipeline_stages[estimate.largest()];
    zest::EstimateJob per_stage = job;
    per_stage.input.world_size = config.pipeline.data_parallel;
    nlohmann::ordered_json out = zest::estimate_json(per_stage, largest.peak, capacity);
    out.erase("advice");  // the planner's advice is for one pipeline stage holding every unit
    out["pipeline"] = zest::pipeline_json(estimate, capacity);
    if (options.fit) {
      out["fit"] = zest::fit_json(fits);
      out["layouts"] = zest::layouts_json(layouts);
    }
    std::cout << out.dump(2) << std::endl;
    return 0;
  }
  zest::print_pipeline_estimate(job, estimate, capacity);
  if (options.fit) {
    std::cout << "with the pipeline block (every pipeline stage must fit):\n";
    zest::print_fit(fits, capacity, config.world.ranks, false);
    zest::print_layouts(layouts, capacity, config.world.ranks);
  }
  return 0;
}

int estimate(const Options& options, bool parameter_mode) {
  if (!options.html_path.empty()) {
    zest::require_html_support("--html");
    zest::check_output_file(options.html_path, zest::ErrorKind::kUsage, "--html");
  }
  std::optional<zest::TrainConfig> config;
  zest::EstimateJob job;
  std::size_t capacity = zest::kUnlimitedCapacity;
  std::size_t host_capacity = zest::kUnlimitedCapacity;
  if (parameter_mode) {
    zest::BareModel bare = options.bare;
    bare.dtype = parse_dtype(options.dtype);
    job = zest::job_from_parameters(bare);
    capacity = parse_capacity(options.device_memory, capacity);
    host_capacity = parse_capacity(options.host_memory, host_capacity, "--host-memory");
  } else {
    config = zest::load_resolved_config(options.config_path, options.overrides);
    capacity = parse_capacity(options.device_memory, config->world.device_memory);
    host_capacity =
        parse_capacity(options.host_memory, config->world.host_memory, "--host-memory");
    // Before the model's units are built: planning them costs time and memory per unit.
    const char* source = options.device_memory.empty() ? "world.device_memory" : "--device-memory";
    zest::check_model_fits_at_all(*config, {capacity, source});
    job = zest::job_from_config(*config);
    job.variants = zest::model_variants(*config);
  }
  if (config && config->pipeline.enabled()) return estimate_pipeline(options, *config, job, capacity);
  const zest::PeakPrediction prediction = zest::predict_peak(job.input);
  std::vector<zest::StageFit> fits;
  zest::TierCapacities tiers;
  std::vector<zest::OffloadRung> ladder;
  std::vector<zest::LayoutFit> layouts;
  if (options.fit) {
    if (capacity == zest::kUnlimitedCapacity) {
      throw zest::Error(zest::ErrorKind::kUsage,
                        "--fit: needs a device capacity (--device-memory, or world.device_memory)");
    }
    fits = parameter_mode ? zest::fit_parameters(options.bare, capacity, host_capacity)
                          : zest::fit_config(*config, capacity, host_capacity);
    tiers.device = capacity;
    tiers.host = host_capacity;
    if (!options.nvme_path.empty()) zest::set_nvme_capacity(tiers, options.nvme_path, "--nvme");
    ladder = zest::offload_ladder(job.input, tiers);
    if (!parameter_mode) layouts = layouts_of(options, capacity);
  }
  if (!options.html_path.empty()) {
    const std::vector<zest::StageEstimate> stages =
        options.fit ? zest::plan_every_stage(job) : std::vector<zest::StageEstimate>();
    zest::write_html_page(options.html_path, zest::estimate_page(job, prediction, capacity, stages,
                                                                 fits, parameter_mode));
  }
  if (options.json) {
    nlohmann::ordered_json out = zest::estimate_json(job, prediction, capacity);
    if (options.fit) {
      out["fit"] = zest::fit_json(fits);
      out["offload_fit"] = zest::offload_fit_json(ladder, tiers);
      if (!parameter_mode) out["layouts"] = zest::layouts_json(layouts);
    }
    std::cout << out.dump(2) << std::endl;
    return 0;
  }
  zest::print_estimate(job, prediction, capacity);
  if (options.fit) {
    zest::print_offload_fit(ladder, tiers);
    // Every rank: a tensor-parallel job's are its data-parallel ranks' groups.
    zest::print_fit(fits, capacity, job.input.world_size * job.input.tensor_parallel_size,
                    parameter_mode);
    if (!parameter_mode) zest::print_layouts(layouts, capacity, config->world.ranks);
  }
  if (!options.html_path.empty()) std::cout << "html: wrote " << options.html_path << "\n";
  return 0;
}

int run(int argc, char** argv) {
  CLI::App app{"Predicts the peak memory per rank of a zest training job.", kProgram};
  Options options;
  auto* config = app.add_option("--config", options.config_path,
                                "JSON config file, as zest-train reads it");
  app.add_option("--set", options.overrides, "override a config key: dotted.key=value")
      ->needs(config);
  auto* params = app.add_option("--params", options.bare.parameters,
                                "a bare parameter count (model state only)");
  auto* world = app.add_option("--world", options.bare.world, "ranks (with --params)")->needs(params);
  auto* stage = app.add_option("--stage", options.bare.stage, "ZeRO stage (with --params)")->needs(params);
  app.add_option("--dtype", options.dtype, "fp32, bf16 or fp16 (with --params)")->needs(params);
  app.add_flag("--offload", options.bare.offload, "offload the optimizer (with --params)")
      ->needs(params);
  app.add_flag("--offload-param", options.bare.offload_param,
               "offload the parameters (with --params --stage 3)")
      ->needs(params);
  app.add_option("--device-memory", options.device_memory,
                 "device capacity per rank (\"80GiB\"); default: world.device_memory");
  app.add_option("--host-memory", options.host_memory,
                 "host memory per rank for offloaded state (\"24GiB\"); default: world.host_memory");
  app.add_option("--nvme", options.nvme_path,
                 "with --fit: the NVMe tier per rank, a directory on the NVMe file system (its "
                 "free space) or a byte count (\"200GiB\")");
  app.add_flag("--fit", options.fit,
               "the first offload that fits (none, optimizer cpu, parameters cpu, optimizer "
               "nvme, parameters nvme), and the largest GPT / parameter count that fits, per stage");
  app.add_flag("--json", options.json, "machine-readable output");
  app.add_option("--html", options.html_path,
                 "also draw the plan (with --fit, every stage) as a self-contained HTML page");
  config->excludes(params);
  if (!zest::parse_command_line(app, argc, argv)) return 0;
  if (options.config_path.empty() && params->count() == 0) {
    throw zest::Error(zest::ErrorKind::kUsage,
                      "give --config FILE, or --params N --world N --stage S (see --help)");
  }
  if (params->count() > 0 && (world->count() == 0 || stage->count() == 0)) {
    throw zest::Error(zest::ErrorKind::kUsage, "--params needs --world and --stage (see --help)");
  }
  return estimate(options, params->count() > 0);
}

}  // namespace

int main(int argc, char** argv) {
  return zest::run_tool(kProgram, [&] { return run(argc, argv); });
}
