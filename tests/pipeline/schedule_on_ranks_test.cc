// Every generated schedule run on ranks as threads with the `local` communicator: each rank
// follows its pipeline stage's actions, with the transfers the interpreter will issue —
// activations and gradients on pipeline groups of their own, sends on streams of their own after
// an event on compute, receives on compute — and a toy model whose gradients say whether every
// micro-batch crossed every virtual stage in order. It proves the contract between the schedule
// simulator and the communicators: a schedule that checks out does not deadlock on them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "pipeline/schedule_generators.h"
#include "pipeline/schedule_simulator.h"
#include "runtime/device_mesh.h"
#include "runtime/world.h"

namespace zest {
namespace {

// Virtual stage v adds v + 1 to its input; its backward adds its output to the gradient. The
// first pipeline stage's gradient of micro-batch b is then the sum of every virtual stage's output.
float expected_gradient(int virtual_stages, int micro_batch) {
  float value = static_cast<float>(micro_batch), sum = 0.0f;
  for (int v = 0; v < virtual_stages; ++v) sum += (value += static_cast<float>(v + 1));
  return sum;
}

void run_schedule(ScheduleKind kind, int ranks, int pipeline_stages, int micro_batches,
                  int chunks) {
  const DeviceMesh mesh(ranks, pipeline_stages);
  const Schedule schedule = make_schedule(kind, pipeline_stages, micro_batches, chunks);
  (void)simulate_schedule(schedule);  // checked before the first step
  const int virtual_stages = schedule.virtual_stages();
  std::vector<std::vector<float>> first_stage_gradients(ranks);
  WorldOptions options;
  options.ranks = ranks;
  options.timeout = std::chrono::seconds(20);
  World(options).run([&](RankContext& context) {
    const MeshCoordinate at = mesh.coordinate(context.rank);
    const std::string group = mesh.pipeline_group_name(at.data_parallel_index);
    // One group per direction: NCCL runs one communicator's operations in issue order.
    auto activations = context.communicator.split(at.data_parallel_index, at.pipeline_stage,
                                                  "activations of the " + group);
    auto gradients = context.communicator.split(at.data_parallel_index, at.pipeline_stage,
                                                "gradients of the " + group);
    const auto table = [&] {
      return std::vector<std::vector<float>>(virtual_stages,
                                             std::vector<float>(micro_batches, 0.0f));
    };
    auto out = table(), in = table(), gradient_in = table(), gradient_out = table();
    std::vector<std::unique_ptr<Event>> events;
    const auto after_compute = [&](Stream& stream) {
      events.push_back(context.device.create_event());
      context.compute.record(*events.back());
      stream.wait(*events.back());
    };
    const int s = at.pipeline_stage;
    for (const Action& action : schedule.actions[s]) {
      const int v = schedule.virtual_stage(s, action.chunk);
      const int b = action.micro_batch;
      const std::string label = describe_action(action, chunks);
      switch (action.kind) {
        case ActionKind::kForward: {
          const float* input = v == 0 ? nullptr
                               : schedule.stage_of(v - 1) == s ? &out[v - 1][b]
                                                                : &in[v][b];
          context.compute.enqueue([&out, input, v, b] {
            out[v][b] = (input ? *input : static_cast<float>(b)) + static_cast<float>(v + 1);
          });
          break;
        }
        case ActionKind::kBackward:
        case ActionKind::kBackwardInput: {
          const float* gradient = v == virtual_stages - 1        ? nullptr
                                  : schedule.stage_of(v + 1) == s ? &gradient_out[v + 1][b]
                                                                   : &gradient_in[v][b];
          context.compute.enqueue([&gradient_out, &out, gradient, v, b] {
            gradient_out[v][b] = (gradient ? *gradient : 0.0f) + out[v][b];
          });
          break;
        }
        case ActionKind::kSendActivations:
          after_compute(context.comm);
          activations->label_next(label.c_str());
          activations->send(context.comm, &out[v][b], 1, DType::kFloat32, action.peer);
          break;
        case ActionKind::kSendGradients:
          after_compute(context.prefetch);
          gradients->label_next(label.c_str());
          gradients->send(context.prefetch, &gradient_out[v][b], 1, DType::kFloat32, action.peer);
          break;
        case ActionKind::kReceiveActivations:
          activations->label_next(label.c_str());
          activations->receive(context.compute, &in[v][b], 1, DType::kFloat32, action.peer);
          break;
        case ActionKind::kReceiveGradients:
          gradients->label_next(label.c_str());
          gradients->receive(context.compute, &gradient_in[v][b], 1, DType::kFloat32,
                             action.peer);
          break;
        case ActionKind::kBackwardWeight:
        case ActionKind::kReduce:
        case ActionKind::kStep:
          break;
      }
    }
    context.synchronize();
    if (s == 0) first_stage_gradients[context.rank] = gradient_out[0];
  });
  for (int rank : mesh.data_parallel_group(0)) {
    for (int b = 0; b < micro_batches; ++b) {
      EXPECT_EQ(first_stage_gradients[rank][b], expected_gradient(virtual_stages, b))
          << schedule.name << ", rank " << rank << ", micro-batch " << b;
    }
  }
}

TEST(ScheduleOnRanks, EveryScheduleRunsWithoutDeadlockAndMovesEveryMicroBatchInOrder) {
  for (const auto& [ranks, pipeline_stages] :
       std::vector<std::pair<int, int>>{{2, 2}, {4, 4}, {4, 2}}) {
    for (int m : {4, 8}) {
      run_schedule(ScheduleKind::kGPipe, ranks, pipeline_stages, m, 1);
      run_schedule(ScheduleKind::kOneFOneB, ranks, pipeline_stages, m, 1);
      run_schedule(ScheduleKind::kInterleavedOneFOneB, ranks, pipeline_stages, m, 2);
      run_schedule(ScheduleKind::kZeroBubbleH1, ranks, pipeline_stages, m, 1);
    }
  }
}

TEST(ScheduleOnRanks, FewerMicroBatchesThanStagesRunsUnder1F1BAndZeroBubble) {
  run_schedule(ScheduleKind::kOneFOneB, 4, 4, 2, 1);
  run_schedule(ScheduleKind::kZeroBubbleH1, 4, 4, 1, 1);
}

}  // namespace
}  // namespace zest
