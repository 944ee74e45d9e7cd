// The built-in GPT trained from C++, configured by the same JSON file as zest-train: the config
// library parses and validates it (every key, with DeepSpeed's names), the resolution step
// decides what needs the model's shapes (resolve/resolved_config.h), the registry builds the
// model it names, and the data library cuts its text into each rank's rows of every batch.
// Usage: gpt_from_config [CONFIG] [--set key=value]...   (default configs/default.json)
// Relative paths in the config are taken from the working directory. Exits 1 unless the loss
// falls, 2 for a bad config.
#include <zest/zest.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/batch_source.h"
#include "kernels/blas_core.h"
#include "optim/lr_schedule.h"

int main(int argc, char** argv) try {
  zest::select_openblas_core();
  std::string path = "configs/default.json";
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--set" && i + 1 < argc) overrides.push_back(argv[++i]);
    else path = arg;
  }

  // Validated whole: a wrong key or value is one Error naming its JSON path.
  const zest::TrainConfig config = zest::load_resolved_config(path, overrides);
  if (config.model.type != "gpt" || config.data.type != "text" || config.pipeline.enabled() ||
      config.tensor_parallel.enabled()) {
    throw zest::Error(zest::ErrorKind::kConfig,
                      path + ": this example trains a GPT on `text` data without pipeline "
                             "stages or tensor parallelism; zest-train runs every other config");
  }

  // Read once, before any rank starts, and shared read-only by the ranks.
  auto text = std::make_shared<const zest::TokenData>(zest::load_text_tokens(config.data.path));
  const std::unique_ptr<zest::BatchSource> batches = zest::sequence_batches(
      zest::TokenBatches::training(text, config.model.gpt.seq_len, config.engine.seed,
                                   config.data.val_fraction),
      std::nullopt);
  const zest::LrSchedule schedule(config.scheduler, config.optimizer.lr);
  std::vector<float> losses(config.steps);

  zest::World(config.world).run([&](zest::RankContext& rank) {
    std::unique_ptr<zest::Module> model = zest::make_model(config.model);
    zest::Engine engine(rank, config.engine);
    auto trainer = engine.shard(*model, zest::make_optimizer(config.optimizer));

    zest::BatchSlice slice;  // this rank's rows of each micro-batch (DeepSpeed's layout)
    slice.global_rows = config.train_batch_size;
    slice.accumulation = config.gradient_accumulation_steps;
    slice.rank = rank.rank;
    slice.world_size = rank.world_size;
    for (std::int64_t step = 1; step <= config.steps; ++step) {
      std::vector<zest::HostBatch> held;  // alive until step() has synchronized
      for (slice.micro_batch = 0; slice.micro_batch < slice.accumulation; ++slice.micro_batch) {
        held.push_back(batches->training(step, slice));
        trainer->forward_backward(held.back().batch());
      }
      const zest::StepStats stats = trainer->step(schedule.lr_at(step));
      if (rank.rank == 0) losses[step - 1] = stats.loss;
    }
  });

  for (std::int64_t step = 1; step <= config.steps; ++step) {
    std::printf("step %lld loss %.4f\n", static_cast<long long>(step), losses[step - 1]);
  }
  const bool fell = losses.back() < losses.front();
  std::printf("gpt_from_config: %lld steps, ZeRO stage %d on %d ranks: loss %.4f -> %.4f (%s)\n",
              static_cast<long long>(config.steps), config.engine.stage, config.world.ranks,
              losses.front(), losses.back(), fell ? "falls" : "DID NOT FALL");
  return fell ? 0 : 1;
} catch (const zest::Error& error) {
  std::fprintf(stderr, "gpt_from_config: error: %s\n", error.what());
  return zest::is_input_error(error.kind()) ? 2 : 1;
}
