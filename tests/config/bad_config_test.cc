// The config loader's bad-input table: each row breaks one thing in a valid config (through the
// same `--set` overrides a user would type) and names the exact message the user must see — the
// JSON path, the value given, and what is allowed. A message that changes must change here.
#include <gtest/gtest.h>

#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include "base/error.h"
#include "resolve/resolved_config.h"

namespace zest {
namespace {

using nlohmann::json;

json mlp_config() {
  return json::parse(R"({
    "model": {"type": "mlp", "sizes": [8, 16, 4]},
    "world": {"ranks": 2},
    "steps": 10,
    "train_batch_size": 8,
    "zero_optimization": {"stage": 3}
  })");
}

json gpt_config() {
  return json::parse(R"({
    "model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 16, "seq_len": 8},
    "data": {"type": "text", "path": "corpus.txt", "val_fraction": 0.1},
    "world": {"ranks": 2},
    "steps": 10,
    "train_batch_size": 8,
    "eval_every": 5
  })");
}

struct BadConfig {
  const char* name;
  bool gpt;  // which valid config the row breaks
  std::vector<std::string> overrides;
  const char* message;  // the whole message, exactly
};

const BadConfig kBadConfigs[] = {
    // activation_checkpointing: a policy that names nothing, DeepSpeed's keys zest refuses
    {"SelectiveRecomputeOfTheMlp", false, {"activation_checkpointing.policy=\"selective\""},
     "activation_checkpointing.policy: \"selective\" needs a unit that can recompute "
     "selectively (a GPT block), and none of the 1 unit named can; use \"full\""},
    {"RecomputedUnitsBeyondTheModel", true,
     {"activation_checkpointing.policy=\"full\"", "activation_checkpointing.units.every=4"},
     "activation_checkpointing.units: every 4th unit names no unit that can be recomputed "
     "among the model's 4 units (the last and an embedding never are); lower every"},
    {"RecomputePolicyUnknown", true, {"activation_checkpointing.policy=\"partial\""},
     "activation_checkpointing.policy: must be none, selective or full, got \"partial\""},
    {"CpuCheckpointingWithoutAPolicy", true, {"activation_checkpointing.cpu_checkpointing=true"},
     "activation_checkpointing.cpu_checkpointing: true needs activation_checkpointing.policy "
     "\"full\" or \"selective\": only a recomputed unit's input is a checkpoint to offload"},
    {"PartitionActivations", true, {"activation_checkpointing.partition_activations=true"},
     "activation_checkpointing.partition_activations: is not supported (got true): it splits "
     "checkpoints across tensor-parallel replicas, and zest's ranks are data-parallel: each "
     "holds its own micro-batch's activations"},
    {"NumberCheckpoints", true, {"activation_checkpointing.number_checkpoints=4"},
     "activation_checkpointing.number_checkpoints: is not supported (got 4): it sizes "
     "DeepSpeed's contiguous buffer; choose the recomputed units with "
     "activation_checkpointing.units"},
    {"RecomputeEveryZeroth", true, {"activation_checkpointing.units.every=0"},
     "activation_checkpointing.units.every: must be an integer >= 1, got 0"},
    {"CpuCheckpointingAtTheTop", true, {"cpu_checkpointing=true"},
     "cpu_checkpointing: unknown key; did you mean 'activation_checkpointing.cpu_checkpointing'?"},
    // unknown keys, with a suggestion
    {"TypoInZeroKey", false, {"zero_optimization.stgae=2"},
     "zero_optimization.stgae: unknown key; did you mean 'zero_optimization.stage'?"},
    {"KeyInTheWrongBlock", false, {"lr=0.1"},
     "lr: unknown key; did you mean 'optimizer.params.lr'?"},
    {"OldNameOfStepsPerPrint", false, {"log_interval=5"},
     "log_interval: unknown key; did you mean 'steps_per_print'?"},
    {"UnknownKeyFarFromAny", false, {"world.flavour=\"x\""},
     "world.flavour: unknown key; allowed here: backend, ranks, ranks_per_node, link, device, "
     "device_memory, host_memory, timeout_s or pin_ranks"},
    {"GptKeyOnTheMlp", false, {"model.n_layer=2"},
     "model.n_layer: unknown key; allowed here: type, sizes or init_from"},
    {"TypoInGptKey", true, {"model.n_embed=32"},
     "model.n_embed: unknown key; did you mean 'model.n_embd'?"},
    {"TypoInDataKey", true, {"data.val_fractoin=0.1"},
     "data.val_fractoin: unknown key; did you mean 'data.val_fraction'?"},
    // wrong types
    {"StepsAsString", false, {"steps=\"5\""}, "steps: must be an integer, got string \"5\""},
    {"FractionalStage", false, {"zero_optimization.stage=2.5"},
     "zero_optimization.stage: must be an integer, got 2.5"},
    {"OverlapAsNumber", false, {"zero_optimization.overlap_comm=1"},
     "zero_optimization.overlap_comm: must be true or false, got 1"},
    {"WorldAsArray", false, {"world=[]"}, "world: must be an object, got array []"},
    {"BatchSizeWord", false, {"train_batch_size=\"many\""},
     "train_batch_size: must be an integer >= 1 or \"auto\", got string \"many\""},
    // out of range
    {"StageFour", false, {"zero_optimization.stage=4"},
     "zero_optimization.stage: must be 0, 1, 2 or 3, got 4"},
    {"NoRanks", false, {"world.ranks=0"}, "world.ranks: must be an integer from 1 to 65536, got 0"},
    {"PinRanksAsABoolean", false, {"world.pin_ranks=\"yes\""},
     "world.pin_ranks: must be \"auto\", \"on\" or \"off\", got \"yes\""},
    {"ZeroWidthLayer", false, {"model.sizes=[8, 0, 4]"},
     "model.sizes[1]: must be an integer >= 1, got 0"},
    {"ZeroLearningRate", false, {"optimizer.params.lr=0"},
     "optimizer.params.lr: must be a number > 0, got 0.0"},
    {"BetaOfOne", false, {"optimizer.params.betas=[0.9, 1.0]"},
     "optimizer.params.betas[1]: must be a number in [0, 1), got 1.0"},
    {"NegativeClipping", false, {"gradient_clipping=-1"},
     "gradient_clipping: must be a number >= 0 (0 turns clipping off), got -1.0"},
    {"BadDeviceMemory", false, {"world.device_memory=\"lots\""},
     "world.device_memory: must be \"unlimited\" or a byte count, or a number with a unit B, kB, "
     "MB, GB, TB, KiB, MiB, GiB or TiB (\"2GiB\"), got \"lots\""},
    {"HeadsDoNotDivideWidth", true, {"model.n_head=3"},
     "model.n_embd: must be divisible by model.n_head (16 % 3 != 0)"},
    {"ZeroLayers", true, {"model.n_layer=0"}, "model.n_layer: must be an integer >= 1, got 0"},
    {"TextNeedsByteVocabulary", true, {"model.vocab_size=100"},
     "model.vocab_size: must be at least 256 for data.type \"text\" (byte tokens), got 100"},
    {"ValFractionOfOne", true, {"data.val_fraction=1"},
     "data.val_fraction: must be a number in [0, 1), got 1"},
    {"NegativeEvalEvery", true, {"eval_every=-1"}, "eval_every: must be an integer >= 0, got -1"},
    // inconsistent
    {"BatchSizesDisagree", false,
     {"train_micro_batch_size_per_gpu=16", "gradient_accumulation_steps=1"},
     "batch sizes are inconsistent: train_batch_size 8, train_micro_batch_size_per_gpu 16, "
     "gradient_accumulation_steps 1, world.ranks 2 (16 x 1 x 2 = 32, not 8); need "
     "train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
     "world.ranks"},
    {"BatchNotAMultipleOfRanks", false, {"train_batch_size=9"},
     "batch sizes are inconsistent: train_batch_size 9, train_micro_batch_size_per_gpu unset, "
     "gradient_accumulation_steps unset, world.ranks 2 (9 is not a multiple of world.ranks 2); "
     "need train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
     "world.ranks"},
    {"FeaturesDisagreeWithModel", false, {"data.features=7"},
     "data.features: must equal model.sizes[0] (8), the model's input width, got 7"},
    {"SyntheticDataForAGpt", true, {"data={\"type\": \"synthetic\"}"},
     "data.type: synthetic classification needs model.type mlp; a gpt reads \"tokens\" or "
     "\"text\""},
    {"TokensForAnMlp", false, {"data={\"type\": \"tokens\", \"path\": \"x.bin\"}"},
     "data.type: \"tokens\" holds token sequences, which need model.type gpt"},
    {"TextWithoutAPath", true, {"data={\"type\": \"text\"}", "eval_every=0"},
     "data.path: missing; a text file, e.g. \"configs/corpus/stories.txt\""},
    {"TwoHeldOutSources", true, {"data.val_path=\"val.txt\""},
     "data.val_fraction: must be 0 when data.val_path is set (held-out data comes from one of "
     "them)"},
    {"EvaluationWithoutHeldOutData", true, {"data.val_fraction=0"},
     "eval_every: 5 needs held-out sequences: set data.val_fraction (e.g. 0.1) or data.val_path, "
     "or eval_every 0"},
    {"Fp16AndBf16", false, {"fp16.enabled=true", "bf16.enabled=true"},
     "fp16.enabled: true needs bf16.enabled false (choose one of fp16 and bf16)"},
    {"WarmupLongerThanTheRun", false,
     {"scheduler={\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_num_steps\": 20, "
      "\"total_num_steps\": 10}}"},
     "scheduler.params.total_num_steps: must be greater than warmup_num_steps (20), got 10"},
    // DeepSpeed counts a warmup of 0 or 1 steps as 2: the message says so, not "(2)" alone.
    {"RunNoLongerThanTheLeastWarmup", false,
     {"scheduler={\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_num_steps\": 1}}",
      "steps=2"},
     "steps: 2 is not more than scheduler.params.warmup_num_steps (1, counted as 2: a warmup is at "
     "least 2 steps, as in DeepSpeed), and WarmupCosineLR decays after the warmup until step "
     "`steps`; run longer, warm up for fewer steps, or set scheduler.params.total_num_steps"},
    {"ExplicitTotalNoLongerThanTheLeastWarmup", false,
     {"scheduler={\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_num_steps\": 0, "
      "\"total_num_steps\": 2}}"},
     "scheduler.params.total_num_steps: must be greater than warmup_num_steps (0, counted as 2), "
     "got 2"},
    {"RunShorterThanItsWarmup", false,
     {"scheduler={\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_num_steps\": 10}}"},
     "steps: 10 is not more than scheduler.params.warmup_num_steps (10), and WarmupCosineLR decays "
     "after the warmup until step `steps`; run longer, warm up for fewer steps, or set "
     "scheduler.params.total_num_steps"},
    {"FaultOnARankBeyondTheWorld", false, {"debug.fault={\"kind\": \"throw\", \"rank\": 2}"},
     "debug.fault.rank: must be below world.ranks (2), got 2"},
    {"UnknownFaultKind", false, {"debug.fault={\"kind\": \"explode\"}"},
     "debug.fault.kind: must be throw, stall, nan_gradient, fail_allocation or stall_nvme_write, "
     "got \"explode\""},
    {"FaultInAUnitTheModelLacks", false,
     {"debug.fault={\"kind\": \"nan_gradient\", \"unit\": \"block1\"}"},
     "debug.fault.unit: must name a unit of the model (layer0 or layer1), got \"block1\""},
    // durations that slept for days, or overflowed into none: bounded, naming the key
    {"StallLongerThanADay", false,
     {"debug.fault={\"kind\": \"stall\", \"stall_seconds\": 1e300}"},
     "debug.fault.stall_seconds: must be a number of seconds from 0 to 86400, got 1e+300"},
    {"CollectiveDelayPastTheTimeout", false,
     {"world.timeout_s=20", "debug.collective_delay_ms=100000000"},
     "debug.collective_delay_ms: must be an integer of milliseconds from 0 to below "
     "world.timeout_s (20000 ms), got 100000000"},
    {"LinkSlowerThanAnyNetwork", false, {"world.link.bandwidth_gbit_s=1e-9"},
     "world.link.bandwidth_gbit_s: must be a number of gigabits per second from 0.001 to 1e6, "
     "got 1e-09"},
    {"LinkTooSlowToModel", false, {"world.link.bandwidth_gbit_s=1e-300"},
     "world.link.bandwidth_gbit_s: must be a number of gigabits per second from 0.001 to 1e6, "
     "got 1e-300"},
    // read but not acted on: refused, never ignored
    {"AllgatherBucketSize", false, {"zero_optimization.allgather_bucket_size=5e8"},
     "zero_optimization.allgather_bucket_size: is not supported yet (got 500000000.0): stages 1-2 "
     "all-gather each unit's updated parameters in place, with no bucket to size; remove the key"},
    {"NonContiguousGradients", false, {"zero_optimization.contiguous_gradients=false"},
     "zero_optimization.contiguous_gradients: false is not supported yet: zest's gradients always "
     "live in one contiguous buffer per unit; remove the key or set it to true"},
    {"OffloadToNvmeWithoutPath", false,
     {"zero_optimization.stage=1", "zero_optimization.offload_optimizer.device=nvme"},
     "zero_optimization.offload_optimizer.nvme_path: missing; the folder the swap files are made "
     "under (a fast disk)"},
    {"OffloadAtStageZero", false,
     {"zero_optimization.stage=0", "zero_optimization.offload_optimizer.device=cpu"},
     "zero_optimization.offload_optimizer.device: \"cpu\" needs zero_optimization.stage 1, 2 or "
     "3 (got 0): only a sharded optimizer state is offloaded; raise the stage or set \"none\""},
    {"OffloadToAnUnknownDevice", false, {"zero_optimization.offload_optimizer.device=gpu"},
     "zero_optimization.offload_optimizer.device: must be cpu, nvme or none, got \"gpu\""},
    {"OffloadNvmePathMisspelt", false, {"zero_optimization.offload_optimizer.nvme_paths=\"/nvme\""},
     "zero_optimization.offload_optimizer.nvme_paths: unknown key; did you mean "
     "'zero_optimization.offload_optimizer.nvme_path'?"},
    {"OffloadOptimizerAtTheTop", false, {"offload_optimizer={}"},
     "offload_optimizer: unknown key; did you mean 'zero_optimization.offload_optimizer'?"},
    {"LastBatchIteration", false,
     {"scheduler={\"type\": \"WarmupLR\", \"params\": {\"last_batch_iteration\": 5}}"},
     "scheduler.params.last_batch_iteration: is not supported yet (a resumed run restores its "
     "step from the checkpoint)"},
};

void PrintTo(const BadConfig& row, std::ostream* out) { *out << row.name; }

class BadConfigTable : public ::testing::TestWithParam<BadConfig> {};

TEST_P(BadConfigTable, GivesTheExactMessage) {
  const BadConfig& row = GetParam();
  json config = row.gpt ? gpt_config() : mlp_config();
  std::string message;
  try {
    parse_resolved_config(config, row.overrides);
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    message = error.what();
  }
  EXPECT_EQ(message, row.message);
}

std::vector<BadConfig> rows() { return {std::begin(kBadConfigs), std::end(kBadConfigs)}; }

INSTANTIATE_TEST_SUITE_P(Rows, BadConfigTable, ::testing::ValuesIn(rows()),
                         [](const ::testing::TestParamInfo<BadConfig>& info) {
                           return std::string(info.param.name);
                         });

TEST(BadConfigTableSize, HoldsAtLeastTwentyFiveRows) { EXPECT_GE(rows().size(), 25u); }

TEST(BadConfigMissing, ModelAndStepsAreRequired) {
  json config = mlp_config();
  config.erase("model");
  try {
    parse_resolved_config(config);
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()),
              "model: missing; e.g. {\"type\": \"gpt\", \"n_layer\": 4, \"n_head\": 4, "
              "\"n_embd\": 128, \"seq_len\": 64}");
  }
  config = mlp_config();
  config.erase("steps");
  try {
    parse_resolved_config(config);
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), "steps: missing; the number of optimizer steps (>= 1)");
  }
}

}  // namespace
}  // namespace zest
