// ZeRO++'s quantized collectives in the engine (EngineOptions::quantized_weights / _gradients):
// the MLP trains as plain ZeRO does, within the int8 error, with qwZ at stage 3 and qgZ at stages
// 1-3 on 2 nodes x 2 ranks; every rank ends with the same parameters; each unit computes, forward
// and backward, with its step's master weights quantized in blocks that never straddle two
// parameters; what crosses nodes per step shrinks by the packed bytes' ratio; the options the
// engine refuses are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/quantized_collectives.h"
#include "kernels/quantize.h"
#include "memory/shard_layout.h"
#include "models/gpt.h"
#include "models/mlp.h"
#include "runtime/link_model.h"
#include "tests/engine/engine_test_support.h"
#include "tests/support/capture_error.h"

namespace zest {
namespace {

using testing::RunResult;
using testing::RunSpec;
using testing::run_mlp;

RunSpec spec(int stage, bool weights, bool gradients) {
  RunSpec spec;
  spec.stage = stage;
  spec.world = 4;
  spec.configure_world = [](WorldOptions& world) {
    world.ranks_per_node = 2;
    world.link.modelled = false;
  };
  spec.configure_engine = [weights, gradients](EngineOptions& engine) {
    engine.quantized_weights = weights;
    engine.quantized_gradients = gradients;
  };
  return spec;
}

// Note: int8 blocks carry up to 1/254 of each block's largest value as error into every gather
// and reduction; over 20 AdamW steps on this problem the loss moved by at most 2.4e-4 of itself
// (qwZ + qgZ at stage 3; 5e-5 with qgZ alone), so 3e-3 leaves a tenfold margin. The runs are
// deterministic (no timing enters the sums), so the margin is for other compilers' rounding.
constexpr double kLossTolerance = 3e-3;

void expect_trains_like(const RunResult& plain, const RunResult& quantized) {
  ASSERT_EQ(plain.losses.size(), quantized.losses.size());
  for (std::size_t step = 0; step < plain.losses.size(); ++step) {
    EXPECT_NEAR(quantized.losses[step], plain.losses[step], kLossTolerance * plain.losses[step])
        << "step " << step;
  }
  // And it learned: the last loss below the first.
  EXPECT_LT(quantized.losses.back(), 0.95 * quantized.losses.front());
}

TEST(QuantizedTraining, Stage3WithQwzAndQgzTrainsAsPlainZeroWithinInt8Error) {
  const RunResult plain = run_mlp(spec(3, false, false));
  const RunResult quantized = run_mlp(spec(3, true, true));
  expect_trains_like(plain, quantized);
  // Not the same numbers: the collectives were quantized.
  EXPECT_NE(plain.losses.back(), quantized.losses.back());
}

TEST(QuantizedTraining, QwzAloneAndQgzAloneAtEachStageTheyServe) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const RunResult plain = run_mlp(spec(stage, false, false));
    expect_trains_like(plain, run_mlp(spec(stage, false, true)));
    if (stage == 3) expect_trains_like(plain, run_mlp(spec(stage, true, false)));
  }
}

TEST(QuantizedTraining, EveryRankEndsWithTheSameParameters) {
  RunSpec quantized = spec(3, true, true);
  std::mutex mutex;
  std::vector<std::vector<float>> firsts(4);
  quantized.after_step = [&](int rank, int step, const StepStats&, Trainer& trainer) {
    if (step != 19) return;
    std::vector<float> mine = trainer.full_parameter(trainer.parameter_names().front());
    std::lock_guard lock(mutex);
    firsts[static_cast<std::size_t>(rank)] = std::move(mine);
  };
  run_mlp(quantized);
  for (int rank = 1; rank < 4; ++rank) EXPECT_EQ(firsts[rank], firsts[0]) << rank;
}

// What a unit computed with, per call: every parameter's values in declaration order (the
// unit's flat order), and those of the units it borrows, one after the other.
struct Seen {
  std::deque<std::vector<float>> forward, backward, borrowed_forward, borrowed_backward;
};

// A unit that copies the parameters it computes with, in forward and in backward, on its stream
// (the CPU device: the views are host memory) into `seen`, then runs the wrapped unit. A unit
// whose gradients replace its parameters is not read in backward: its slot holds gradients.
class Recording final : public Unit {
 public:
  Recording(Unit& inner, Seen& seen) : inner_(inner), seen_(seen) {}
  const std::string& name() const override { return inner_.name(); }
  std::vector<ParamSpec> parameters() const override { return inner_.parameters(); }
  std::vector<int> borrowed_units() const override { return inner_.borrowed_units(); }
  bool gradients_replace_parameters() const override {
    return inner_.gradients_replace_parameters();
  }
  void forward(UnitContext& context) override {
    record(context, seen_.forward, seen_.borrowed_forward, true);
    inner_.forward(context);
  }
  void backward(UnitContext& context) override {
    record(context, seen_.backward, seen_.borrowed_backward, !gradients_replace_parameters());
    inner_.backward(context);
  }
  // The units' parameter counts, by index into Module::units(), for the borrowed ones.
  std::vector<std::vector<ParamSpec>> lenders;

 private:
  void record(UnitContext& context, std::deque<std::vector<float>>& own,
              std::deque<std::vector<float>>& borrowed, bool own_too) {
    std::vector<Tensor> params, lent;
    for (std::size_t i = 0; own_too && i < parameters().size(); ++i) {
      params.push_back(context.param(i));
    }
    const std::vector<int> from = borrowed_units();
    for (std::size_t b = 0; b < from.size(); ++b) {
      for (std::size_t i = 0; i < lenders.at(static_cast<std::size_t>(from[b])).size(); ++i) {
        lent.push_back(context.borrowed_param(b, i));
      }
    }
    std::vector<float>& into = own.emplace_back();
    std::vector<float>& into_lent = borrowed.emplace_back();
    context.stream().enqueue([params, lent, &into, &into_lent] {
      for (const Tensor& param : params) {
        into.insert(into.end(), param.as<const float>(), param.as<const float>() + param.numel());
      }
      for (const Tensor& param : lent) {
        into_lent.insert(into_lent.end(), param.as<const float>(),
                         param.as<const float>() + param.numel());
      }
    });
  }
  Unit& inner_;
  Seen& seen_;
};

// `Model`, each unit recorded into seen[unit] (owned by the caller; it outlives the model).
template <typename Model, typename Config>
class Recorded final : public Module {
 public:
  Recorded(Config config, std::vector<Seen>& seen) : model_(std::move(config)) {
    const std::vector<Unit*> units = model_.units();
    seen.resize(units.size());
    std::vector<std::vector<ParamSpec>> specs;
    for (Unit* unit : units) specs.push_back(unit->parameters());
    for (std::size_t u = 0; u < units.size(); ++u) {
      recording_.push_back(std::make_unique<Recording>(*units[u], seen[u]));
      recording_.back()->lenders = specs;
    }
  }
  std::vector<Unit*> units() override {
    std::vector<Unit*> units;
    for (const auto& unit : recording_) units.push_back(unit.get());
    return units;
  }

 private:
  Model model_;
  std::vector<std::unique_ptr<Recording>> recording_;
};
using RecordingMlp = Recorded<Mlp, MlpConfig>;

// What qwZ should hand a unit whose fp32 master is `flat` (the unit's flat buffer, padding
// included): each rank's shard, cut at the shard's start and at each parameter's start inside
// it, each run quantized on its own in blocks of `block` (the int8 kernel is
// kernels/quantize.h's, tested against float64 there).
std::vector<float> quantized_per_parameter(const ShardLayout& layout, const std::vector<float>& flat,
                                           std::size_t block) {
  std::vector<float> out(flat.size());
  const std::size_t shard = layout.shard_length();
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    std::vector<std::size_t> cuts = {rank * shard, (rank + 1) * shard};
    for (const ParamPlace& param : layout.params()) {
      if (param.offset > cuts[0] && param.offset < cuts[1]) cuts.push_back(param.offset);
    }
    std::sort(cuts.begin(), cuts.end());
    for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
      const std::size_t count = cuts[c + 1] - cuts[c];
      std::vector<char> packed(quantized_bytes(count, block));
      cpu::quantize_blocks(flat.data() + cuts[c], DType::kFloat32, count, block, packed.data());
      cpu::dequantize_blocks(packed.data(), count, block, out.data() + cuts[c], DType::kFloat32);
    }
  }
  return out;
}

// Every unit's flat fp32 master (padding included), as the trainer holds it now. A collective.
std::vector<std::vector<float>> master_flats(Trainer& trainer) {
  std::vector<std::vector<float>> flats;
  for (const ShardLayout& layout : trainer.layouts()) {
    std::vector<float> flat;
    for (const ParamPlace& param : layout.params()) {
      const std::vector<float> value = trainer.full_parameter(layout.unit_name() + "." + param.name);
      flat.insert(flat.end(), value.begin(), value.end());
    }
    flat.resize(layout.flat_length(), 0.0f);
    flats.push_back(std::move(flat));
  }
  return flats;
}

// The plumbing of qwZ, step by step: each unit's forward and backward compute with exactly the
// dequantized int8 blocks of the master weights the previous step left (not a stale slot, not
// other values in backward than in forward), on every rank; blocks never straddle two
// parameters (the MLP's layers put a weight's last rows and its bias in one shard at 4 ranks).
TEST(QuantizedTraining, UnitsComputeWithTheQuantizedMasterOfTheirStepBlockedPerParameter) {
  constexpr int kRanks = 4;
  constexpr int kSteps = 4;
  RunSpec run = spec(3, true, false);
  run.steps = kSteps;
  std::vector<std::vector<Seen>> seen(kRanks);  // per rank, per unit
  run.make_model = [&](int rank) {
    return std::make_unique<RecordingMlp>(MlpConfig{run.sizes},
                                          seen[static_cast<std::size_t>(rank)]);
  };
  // masters[step][unit]: the unit's flat fp32 master after `step`, padding included.
  std::vector<std::vector<std::vector<float>>> masters(kSteps);
  std::vector<ShardLayout> layouts;
  run.after_step = [&](int rank, int step, const StepStats&, Trainer& trainer) {
    std::vector<std::vector<float>> flats = master_flats(trainer);
    if (rank != 0) return;
    masters[static_cast<std::size_t>(step)] = std::move(flats);
    layouts = trainer.layouts();
  };
  run_mlp(run);
  ASSERT_EQ(layouts.size(), run.sizes.size() - 1);
  bool straddled = false;  // some shard holds the end of one parameter and the start of another
  for (const ShardLayout& layout : layouts) {
    for (const ParamPlace& param : layout.params()) straddled |= param.offset % layout.shard_length() != 0;
  }
  ASSERT_TRUE(straddled);
  for (int rank = 0; rank < kRanks; ++rank) {
    for (std::size_t u = 0; u < layouts.size(); ++u) {
      const Seen& unit = seen[static_cast<std::size_t>(rank)][u];
      ASSERT_EQ(unit.forward.size(), static_cast<std::size_t>(kSteps));
      ASSERT_EQ(unit.backward.size(), static_cast<std::size_t>(kSteps));
      for (int step = 1; step < kSteps; ++step) {
        SCOPED_TRACE("rank " + std::to_string(rank) + ", unit " + std::to_string(u) + ", step " +
                     std::to_string(step));
        std::vector<float> expected = quantized_per_parameter(
            layouts[u], masters[static_cast<std::size_t>(step - 1)][u], 256);
        expected.resize(layouts[u].numel());
        EXPECT_EQ(unit.forward[static_cast<std::size_t>(step)], expected);
        EXPECT_EQ(unit.backward[static_cast<std::size_t>(step)], expected);
      }
    }
  }
}

// The GPT's tied head reads the embedding's wte from the embedding's gather slot, in forward and
// in backward (before the slot becomes wte's gradient): the same quantized values the embedding's
// forward used, those of the step's master, as every block's forward and backward use.
TEST(QuantizedTraining, TiedGptHeadReadsTheQuantizedWteOfItsStep) {
  constexpr int kRanks = 2;
  constexpr int kSteps = 3;
  constexpr std::int64_t kSequences = 4;
  const GptConfig config{/*n_layer=*/1, /*n_head=*/2, /*n_embd=*/32, /*vocab_size=*/64,
                         /*seq_len=*/8};
  std::vector<std::vector<Seen>> seen(kRanks);  // per rank, per unit
  std::vector<std::vector<std::vector<float>>> masters(kSteps);  // [step][unit], before the step
  std::vector<ShardLayout> layouts;
  WorldOptions world;
  world.ranks = kRanks;
  World(world).run([&](RankContext& context) {
    Recorded<Gpt, GptConfig> model(config, seen[static_cast<std::size_t>(context.rank)]);
    EngineOptions options;
    options.stage = 3;
    options.quantized_weights = true;
    Engine engine(context, options);
    auto trainer = engine.shard(model, make_optimizer(OptimizerOptions{}));
    std::mt19937 rng(11 + context.rank);
    std::uniform_int_distribution<std::int32_t> token(0, config.vocab_size - 1);
    std::vector<std::int32_t> inputs(kSequences * config.seq_len);
    std::vector<std::int32_t> targets(inputs.size());
    for (int step = 0; step < kSteps; ++step) {
      std::vector<std::vector<float>> flats = master_flats(*trainer);
      for (auto& id : inputs) id = token(rng);
      for (auto& id : targets) id = token(rng);
      const Batch batch{Tensor{inputs.data(), {kSequences, config.seq_len}, DType::kInt32},
                        Tensor{targets.data(), {kSequences, config.seq_len}, DType::kInt32}};
      trainer->forward_backward(batch);
      trainer->step();
      if (context.rank != 0) continue;
      masters[static_cast<std::size_t>(step)] = std::move(flats);
      layouts = trainer->layouts();
    }
    context.synchronize();
  });
  const std::size_t head = layouts.size() - 1;
  ASSERT_EQ(layouts.size(), 3u);  // embedding, block0, head
  for (int rank = 0; rank < kRanks; ++rank) {
    const std::vector<Seen>& units = seen[static_cast<std::size_t>(rank)];
    for (int step = 0; step < kSteps; ++step) {
      SCOPED_TRACE("rank " + std::to_string(rank) + ", step " + std::to_string(step));
      const auto s = static_cast<std::size_t>(step);
      std::vector<std::vector<float>> expected;
      for (std::size_t u = 0; u < layouts.size(); ++u) {
        expected.push_back(quantized_per_parameter(layouts[u], masters[s][u], 256));
        expected.back().resize(layouts[u].numel());
      }
      EXPECT_EQ(units[0].forward.at(s), expected[0]);
      EXPECT_EQ(units[1].forward.at(s), expected[1]);
      EXPECT_EQ(units[1].backward.at(s), expected[1]);
      EXPECT_EQ(units[head].forward.at(s), expected[head]);
      EXPECT_EQ(units[head].backward.at(s), expected[head]);
      EXPECT_EQ(units[head].borrowed_forward.at(s), expected[0]);
      EXPECT_EQ(units[head].borrowed_backward.at(s), expected[0]);
    }
  }
}

// What each rank put on the wire in two steps of the MLP at stage 3 on 2 nodes x 2 ranks, and
// the units' layouts.
std::vector<WireBytes> wire_of_two_steps(bool quantized, std::vector<ShardLayout>* layouts) {
  const RunSpec run = spec(3, quantized, quantized);
  std::mutex mutex;
  std::vector<WireBytes> bytes(4);
  WorldOptions world;
  world.ranks = 4;
  run.configure_world(world);
  World(world).run([&](RankContext& context) {
    Mlp model(MlpConfig{{13, 31, 17, 7}});
    EngineOptions options;
    options.stage = 3;
    run.configure_engine(options);
    Engine engine(context, options);
    auto trainer = engine.shard(model, make_optimizer(OptimizerOptions{}));
    std::vector<float> inputs;
    std::vector<std::int32_t> targets;
    const WireBytes start = context.wire->snapshot();
    for (int step = 0; step < 2; ++step) {
      testing::make_global_batch(step, 60, 13, 7, inputs, targets);
      trainer->forward_backward(testing::rank_rows(inputs, targets, 13, context.rank, 15));
      trainer->step();
    }
    context.synchronize();
    std::lock_guard lock(mutex);
    bytes[context.rank] = context.wire->snapshot() - start;
    if (layouts && context.rank == 0) *layouts = trainer->layouts();
  });
  return bytes;
}

TEST(QuantizedTrainingWire, InterNodeBytesShrinkByThePackedRatio) {
  constexpr int kAllGather = static_cast<int>(WireKind::kAllGather);
  constexpr int kReduceScatter = static_cast<int>(WireKind::kReduceScatter);
  constexpr int kSend = static_cast<int>(WireKind::kSend);
  std::vector<ShardLayout> layouts;
  const std::vector<WireBytes> plain = wire_of_two_steps(false, nullptr);
  const std::vector<WireBytes> quantized = wire_of_two_steps(true, &layouts);
  // Per unit, qwZ's gather moves P(S) = quantized_bytes(S, 256) bytes per shard of S fp32 (4S
  // bytes), the same ring; qgZ sends each other node one packed partial, P(S), where the ring's
  // reduce-scatter over 4 ranks on 2 nodes sends 2/4 of 3/4 of 4 shards of 4S bytes, 6S. Each
  // unit is gathered and reduced as often in both runs, so the ratios of the totals lie between
  // the units' own.
  double gather_low = 1e9, gather_high = 0, reduce_low = 1e9, reduce_high = 0;
  for (const ShardLayout& layout : layouts) {
    const double shard = static_cast<double>(layout.shard_length());
    const double packed = static_cast<double>(quantized_bytes(layout.shard_length(), 256));
    gather_low = std::min(gather_low, packed / (4 * shard));
    gather_high = std::max(gather_high, packed / (4 * shard));
    reduce_low = std::min(reduce_low, packed / (6 * shard));
    reduce_high = std::max(reduce_high, packed / (6 * shard));
  }
  ASSERT_FALSE(layouts.empty());
  for (int rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const double gathers = quantized[rank].inter_node[kAllGather] / plain[rank].inter_node[kAllGather];
    EXPECT_GE(gathers, gather_low - 1e-12);
    EXPECT_LE(gathers, gather_high + 1e-12);
    // qgZ's bytes are sends, none a reduce-scatter.
    EXPECT_EQ(quantized[rank].inter_node[kReduceScatter], 0.0);
    EXPECT_EQ(plain[rank].inter_node[kSend], 0.0);
    const double reduces = quantized[rank].inter_node[kSend] / plain[rank].inter_node[kReduceScatter];
    EXPECT_GE(reduces, reduce_low - 1e-12);
    EXPECT_LE(reduces, reduce_high + 1e-12);
    EXPECT_LT(quantized[rank].inter_total(), 0.3 * plain[rank].inter_total());
  }
}

TEST(QuantizedTraining, RefusedCombinationsAreOneLineConfigErrors) {
  const Error weights = testing::capture_error([] { run_mlp(spec(2, true, false)); });
  EXPECT_EQ(weights.kind(), ErrorKind::kConfig);
  EXPECT_NE(std::string(weights.what()).find("zero_optimization.zero_quantized_weights"),
            std::string::npos);
  EXPECT_EQ(std::string(weights.what()).find('\n'), std::string::npos);
  const Error gradients = testing::capture_error([] { run_mlp(spec(0, false, true)); });
  EXPECT_NE(std::string(gradients.what()).find("zero_optimization.zero_quantized_gradients"),
            std::string::npos);
  // qwZ with hybrid sharding gathers inside the node through int8 as well.
  RunSpec hybrid_weights = spec(3, true, false);
  hybrid_weights.configure_engine = [](EngineOptions& engine) {
    engine.quantized_weights = true;
    engine.hybrid_shard_size = kHybridShardNode;
  };
  expect_trains_like(run_mlp(spec(3, false, false)), run_mlp(hybrid_weights));
}

}  // namespace
}  // namespace zest
