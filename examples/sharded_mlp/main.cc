// An MLP sharded across ranks with the library API: a World of local ranks (threads), an Engine
// per rank, the model sharded at a ZeRO stage, then forward_backward / step in a loop. Every rank
// computes on its own rows of each global batch; the loss printed is the mean over all ranks.
// Usage: sharded_mlp [--ranks N] [--stage S] [--steps N]. Exits 1 unless the loss falls.
#include <zest/zest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "data/synthetic_classification.h"
#include "kernels/blas_core.h"

namespace {

struct Options {
  int ranks = 4;
  int stage = 3;
  int steps = 30;
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--ranks") options.ranks = value;
    else if (flag == "--stage") options.stage = value;
    else if (flag == "--steps") options.steps = value;
    else throw zest::Error(zest::ErrorKind::kUsage, "unknown flag " + flag);
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) try {
  // Before any thread starts: lets OpenBLAS pick its AVX-512 kernels where the CPU has them.
  zest::select_openblas_core();
  const Options options = parse(argc, argv);

  constexpr std::int64_t kFeatures = 16, kClasses = 4, kGlobalBatch = 64;
  // Every sample is a function of (seed, step, row): each rank draws only its own rows.
  const zest::SyntheticClassification task({kFeatures, kClasses, /*seed=*/1234});

  zest::WorldOptions world;
  world.ranks = options.ranks;  // ranks as threads of this process, `local` backend
  std::vector<float> losses(options.steps);

  zest::World(world).run([&](zest::RankContext& rank) {
    zest::Mlp model(zest::MlpConfig{{kFeatures, 64, 64, kClasses}});
    zest::EngineOptions engine_options;
    engine_options.stage = options.stage;  // 0 (DDP) .. 3 (parameters sharded too)
    zest::Engine engine(rank, engine_options);
    zest::OptimizerOptions adamw;
    adamw.lr = 3e-3f;
    std::unique_ptr<zest::Trainer> trainer = engine.shard(model, zest::make_optimizer(adamw));

    for (int step = 1; step <= options.steps; ++step) {
      // Kept alive until step() returns: the streams may still read it after forward_backward.
      const zest::HostBatch batch =
          task.micro_batch(step, 0, 1, kGlobalBatch, rank.rank, rank.world_size);
      trainer->forward_backward(batch.batch());
      const zest::StepStats stats = trainer->step();
      if (rank.rank == 0) losses[step - 1] = stats.loss;
    }
  });

  for (int step = 1; step <= options.steps; ++step) {
    std::printf("step %d loss %.4f\n", step, losses[step - 1]);
  }
  const bool fell = losses.back() < 0.8f * losses.front();
  std::printf("sharded_mlp: %d ranks, ZeRO stage %d: loss %.4f -> %.4f (%s)\n", options.ranks,
              options.stage, losses.front(), losses.back(), fell ? "falls" : "DID NOT FALL");
  return fell ? 0 : 1;
} catch (const zest::Error& error) {
  std::fprintf(stderr, "sharded_mlp: error: %s\n", error.what());
  return 2;
}
