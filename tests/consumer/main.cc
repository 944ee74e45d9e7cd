// Uses an installed zest the way a library user would: the umbrella header, an Error, the dtype
// table, and a short sharded training run. Exits 0 only when every value is right.
#include <zest/zest.h>

#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

int main() {
  int failures = 0;
  auto expect = [&failures](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "zest_consumer: wrong %s\n", what);
      ++failures;
    }
  };

  zest::Error error(zest::ErrorKind::kConfig, "optimizer.lr: must be positive");
  expect(error.kind() == zest::ErrorKind::kConfig, "Error::kind");
  expect(std::string(error.what()) == "optimizer.lr: must be positive", "Error::what");
  expect(zest::is_input_error(error.kind()), "is_input_error");

  expect(zest::dtype_size(zest::DType::kFloat32) == 4, "dtype_size(fp32)");
  expect(zest::dtype_size(zest::DType::kBFloat16) == 2, "dtype_size(bf16)");
  expect(zest::parse_dtype("bf16") == zest::DType::kBFloat16, "parse_dtype(bf16)");
  expect(static_cast<float>(zest::BFloat16(1.0f)) == 1.0f, "BFloat16 round trip");

  // The library end to end: an MLP sharded at stage 3 across two ranks trains three steps.
  zest::WorldOptions world_options;
  world_options.ranks = 2;
  std::vector<float> losses(3);
  zest::World(world_options).run([&](zest::RankContext& context) {
    zest::Mlp model(zest::MlpConfig{{4, 8, 3}});
    zest::EngineOptions options;
    options.stage = 3;
    zest::Engine engine(context, options);
    auto trainer = engine.shard(model, zest::make_optimizer(zest::OptimizerOptions{}));
    std::vector<float> inputs(2 * 4, 0.5f);
    std::vector<std::int32_t> targets = {1, 2};
    zest::Batch batch{zest::Tensor{inputs.data(), {2, 4}, zest::DType::kFloat32},
                      zest::Tensor{targets.data(), {2}, zest::DType::kInt32}};
    for (int step = 0; step < 3; ++step) {
      trainer->forward_backward(batch);
      const zest::StepStats stats = trainer->step();
      if (context.rank == 0) losses[step] = stats.loss;
    }
  });
  expect(losses[2] < losses[0], "loss falling over three steps of the library API");

  if (failures == 0) std::printf("zest_consumer: ok\n");
  return failures == 0 ? 0 : 1;
}
