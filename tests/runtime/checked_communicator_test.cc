// The collective-order check: ranks that issue the same collectives run as before; ranks that
// diverge (one skips a collective, or issues another size) all fail, promptly, with one message
// naming the first collective that differs and what each side issued — never a hang.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "base/error.h"
#include "models/mlp.h"
#include "engine/engine.h"
#include "runtime/world.h"

namespace zest {
namespace {

WorldOptions checked_world(int ranks) {
  WorldOptions options;
  options.ranks = ranks;
  options.check_collectives = true;
  options.timeout = std::chrono::seconds(20);
  return options;
}

std::string failure_of(const WorldOptions& options,
                       const std::function<void(RankContext&)>& work) {
  try {
    World(options).run(work);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(CheckedCommunicator, AgreeingRanksRunAsBefore) {
  std::vector<float> sums(3);
  World(checked_world(3)).run([&](RankContext& context) {
    float value = static_cast<float>(context.rank + 1);
    std::vector<float> gathered(3);
    context.communicator.all_gather(context.comm, &value, gathered.data(), 1, DType::kFloat32);
    context.communicator.all_reduce(context.comm, &value, &value, 1, DType::kFloat32,
                                    Reduction::kSum);
    context.communicator.barrier(context.comm);
    context.comm.synchronize();
    sums[static_cast<std::size_t>(context.rank)] = value + gathered[2];
  });
  EXPECT_EQ(sums, (std::vector<float>{9.0f, 9.0f, 9.0f}));
}

TEST(CheckedCommunicator, ARankThatIssuesAnotherCollectiveIsNamed) {
  const auto start = std::chrono::steady_clock::now();
  const std::string message = failure_of(checked_world(3), [](RankContext& context) {
    std::vector<float> data(12, 1.0f);
    context.communicator.label_next("first");
    context.communicator.all_reduce(context.comm, data.data(), data.data(), 4, DType::kFloat32,
                                    Reduction::kSum);
    // Rank 2 skips the gather the others issue and goes on to the reduction.
    if (context.rank != 2) {
      context.communicator.label_next("gather block3");
      context.communicator.all_gather(context.comm, data.data(), data.data(), 4, DType::kFloat32);
    }
    context.communicator.label_next("reduce block2");
    context.communicator.reduce_scatter(context.comm, data.data(), data.data(), 4,
                                        DType::kFloat32, Reduction::kMean);
    context.comm.synchronize();
  });
  EXPECT_NE(message.find("collective order differs between ranks at collective #2: "
                         "ranks 0,1: all_gather of 4 fp32 elements (gather block3); "
                         "rank 2: reduce_scatter of 4 fp32 elements, mean (reduce block2)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("a unit skipped on one rank"), std::string::npos) << message;
  // Found at the first difference, not by waiting out the 20 s timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(CheckedCommunicator, ACollectiveOfAnotherSizeInTheEngineIsNamed) {
  // Stage 3: rank 1 asks for another parameter than the others, so its gather has another size.
  const std::string message = failure_of(checked_world(2), [](RankContext& context) {
    Mlp model(MlpConfig{{8, 16, 4}});
    EngineOptions options;
    options.stage = 3;
    Engine engine(context, options);
    auto trainer = engine.shard(model, make_optimizer(OptimizerOptions{}));
    trainer->full_parameter(context.rank == 1 ? "layer1.weight" : "layer0.weight");
  });
  EXPECT_NE(message.find("collective order differs between ranks"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0: all_gather of 96 fp32 elements"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 1: all_gather of 64 fp32 elements"), std::string::npos) << message;
}

}  // namespace
}  // namespace zest
