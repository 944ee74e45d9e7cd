// Shared by the hpZ and ZeRO++ suites: what rank 0 puts on the wire (every rank counts alike) in
// the second step of a deep MLP at stage 3 on 2 nodes x 2 ranks, and in one evaluate() after it
// (forward gathers only). The first step is left out: a step's counts are compared, and the first
// one's include nothing extra.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "engine/engine.h"
#include "models/mlp.h"
#include "runtime/link_model.h"
#include "runtime/world.h"
#include "tests/engine/engine_test_support.h"
#include "tests/support/nodes_world.h"

namespace zest::testing {

struct SecondStepWire {
  WireBytes step;
  WireBytes evaluate;
};

// `configure` sets the engine options beyond stage 3 (qwZ, hpZ, hybrid sharding, qgZ). Eight
// layers: more units than the ring holds, so backward gathers most of them again.
inline SecondStepWire second_step_wire(const std::function<void(EngineOptions&)>& configure) {
  std::mutex mutex;
  SecondStepWire wire;
  World(nodes_world(2, 2)).run([&](RankContext& context) {
    Mlp model(MlpConfig{{13, 31, 29, 27, 25, 23, 21, 19, 7}});
    EngineOptions options;
    options.stage = 3;
    configure(options);
    Engine engine(context, options);
    auto trainer = engine.shard(model, make_optimizer(OptimizerOptions{}));
    std::vector<float> inputs;
    std::vector<std::int32_t> targets;
    make_global_batch(0, 60, 13, 7, inputs, targets);
    const Batch batch = rank_rows(inputs, targets, 13, context.rank, 15);
    trainer->forward_backward(batch);
    trainer->step();
    context.synchronize();
    const WireBytes before_step = context.wire->snapshot();
    trainer->forward_backward(batch);
    trainer->step();
    context.synchronize();
    const WireBytes after_step = context.wire->snapshot();
    trainer->evaluate(batch);
    context.synchronize();
    const WireBytes after_evaluate = context.wire->snapshot();
    if (context.rank != 0) return;
    std::lock_guard lock(mutex);
    wire.step = after_step - before_step;
    wire.evaluate = after_evaluate - after_step;
  });
  return wire;
}

}  // namespace zest::testing
