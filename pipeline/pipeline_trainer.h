// The pipeline interpreter: one rank's part of a model split into pipeline stages, each pipeline
// stage trained by the ZeRO engine (any stage 0-3) in its data-parallel group, driven through a
// schedule's action list (pipeline/schedule.h). The device mesh (runtime/device_mesh.h) says
// where the rank sits: rank = pipeline stage × D + data-parallel index. A tensor-parallel model
// (Module::tensor_parallel_group) runs one such pipeline per tensor-parallel index, each over the
// context of that index's ranks (runtime/tensor_parallel_groups.h): the groups below are then
// among ranks of one tensor index, and the step's gradient norm is summed across the model's
// group as well.
//
// What it builds once: the groups — a data-parallel group per pipeline stage (its ZeRO
// collectives), two pipeline groups per data-parallel index (activations forward, gradients
// back: NCCL runs one communicator's operations in issue order, so one group for both would
// deadlock 1F1B's steady state), and, when a unit is lent across pipeline stages (GPT's embedding,
// read by the head), a group of the lender's and the borrower's pipeline stages — and one
// ZeroTrainer per model chunk of this pipeline stage over a SubModule of the chunk's units
// (engine/sub_module.h), driven by the chunk's PipelineStageRunner (pipeline/stage_runner.h). It
// checks the schedule with simulate_schedule before the first step (a kConfig Error).
//
// A step: forward_backward(batch) runs the rank's action list over the step's micro-batches
// (sends on streams of their own after an event on compute, receives on compute, each labelled
// with describe_action's words, every group told the step) and returns the step's mean loss on
// every rank; step() updates every chunk with the world's gradient norm. Invariants: every rank
// calls the same methods in the same order; the tied embedding's reduced gradients are summed
// across the two pipeline stages before either updates it, so the copies stay identical; a failing
// rank fails its peers' transfers and collectives, naming it, within the timeout — never a hang.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/sub_module.h"
#include "engine/zero_trainer.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline_options.h"
#include "pipeline/schedule.h"
#include "pipeline/stage_runner.h"
#include "runtime/device_mesh.h"
#include "runtime/hybrid_communicator.h"
#include "runtime/world.h"

namespace zest {

// Builds the whole model, the same on every call: the pipeline makes one copy per micro-batch of
// a step (units keep a micro-batch's state between its forward and its backward) and trains only
// its pipeline stage's units of each.
using ModuleFactory = std::function<std::unique_ptr<Module>()>;

class PipelineTrainer final : public Trainer {
 public:
  // `context` is the rank's, in the world of pipeline.stages × data-parallel ranks. `engine`
  // applies inside each pipeline stage (its gradient_accumulation_steps must be 1: the pipeline
  // accumulates over pipeline.micro_batches). kConfig Errors for options the pipeline cannot
  // run, naming the key (pipeline_options.h; the world's ranks not a multiple of the pipeline
  // stages).
  PipelineTrainer(RankContext& context, const EngineOptions& engine,
                  const PipelineOptions& pipeline, const ModuleFactory& make_module,
                  const OptimizerOptions& optimizer);
  // The same with the schedule made by the caller (the memory planner runs the one it plans),
  // checked the same way; `pipeline.schedule` then only has to fit its chunk count.
  PipelineTrainer(RankContext& context, const EngineOptions& engine,
                  const PipelineOptions& pipeline, Schedule schedule,
                  const ModuleFactory& make_module, const OptimizerOptions& optimizer);
  ~PipelineTrainer() override;

  // One whole step's schedule. `batch` is this data-parallel index's rows of the global batch,
  // all micro-batches of the step (rows a multiple of pipeline.micro_batches; micro-batch i is
  // the i-th run of rows); the first pipeline stage reads its inputs, the last its targets, and
  // every pipeline stage its row count. Returns the step's mean loss over the global batch, on
  // every rank. Call it once, then step().
  float forward_backward(const Batch& batch) override;
  StepStats step(float lr = -1.0f) override;
  // Forward only, between steps (evaluation.cc): `batch` (this data-parallel index's rows) as one
  // micro-batch through every virtual stage in order; the mean loss over every data-parallel
  // index, on every rank. Nothing is kept for a backward and no gradient changes.
  float evaluate(const Batch& batch) override;

  // A collective over the world: the owning pipeline stage gathers it, then broadcasts it to every
  // rank.
  std::vector<float> full_parameter(const std::string& name) override;
  // The whole model's, in flat order (not only this pipeline stage's).
  std::vector<std::string> parameter_names() const override;
  // This rank's units' layouts, chunk by chunk (lent copies included).
  const std::vector<ShardLayout>& layouts() const override { return layouts_; }
  // This rank's model state: the sum over its chunks.
  MemoryPrediction predicted_memory() const override;
  int stage() const override { return engine_.stage; }
  std::int64_t steps_taken() const override { return chunks_.front().trainer->steps_taken(); }
  const EngineOptions& options() const override { return engine_; }
  // Checkpoints: `unit` indexes layouts(); each chunk makes its replicated copies agree in its
  // data-parallel group. The placement lists the whole model once, each unit in the pipeline
  // pipeline stage that owns it (a lent copy is saved by its lender's pipeline stage and loaded
  // from it).
  std::vector<StateShard> state_shards(std::size_t unit) override;
  void state_loaded() override;
  void hold_state_for(std::shared_ptr<Event> readers) override;
  std::optional<CheckpointPlacement> checkpoint_placement() const override { return placement_; }
  std::size_t swap_bytes() const override;
  TrainerCounters counters() const override { return chunks_.front().trainer->counters(); }
  void set_counters(const TrainerCounters& counters) override;

  const DeviceMesh& mesh() const { return mesh_; }
  const Schedule& schedule() const { return schedule_; }
  // The memory planner's, on the shape-only device (runtime/shape_device.h), whose memory
  // backs nothing: a received shape header reads as zeros there, so `shapes` says what it
  // would hold — the shape and dtype of the activations virtual stage v receives (data unused).
  using ReceivedShapes = std::function<Tensor(int virtual_stage)>;
  void answer_shape_headers(ReceivedShapes shapes) { received_shapes_ = std::move(shapes); }
  // Tests only: leave the tied units' sum across pipeline stages out, to show that the parity
  // tests see it.
  void skip_tied_sum_for_tests() { skip_tied_sum_ = true; }
  // For tests: chunk c's trainer on this rank.
  ZeroTrainer& chunk_trainer(int chunk) { return *chunks_.at(static_cast<std::size_t>(chunk)).trainer; }

 private:
  struct Chunk {
    int virtual_stage = 0;
    std::size_t first_unit = 0;  // in the whole model
    std::vector<std::unique_ptr<SubModule>> replicas;  // per micro-batch of a step
    std::vector<bool> lent;  // per unit of the chunk: tied to a unit of another pipeline stage
    std::unique_ptr<RankContext> context;  // the data-parallel group's view of this rank
    std::unique_ptr<ZeroTrainer> trainer;
    std::unique_ptr<PipelineStageRunner> runner;  // drives `trainer` over `replicas`
  };
  struct Step;  // one step's transfers and buffers (interpreter.cc)

  // `tied`: the two pipeline stages of the tied group, or (-1, -1) for none.
  void build_groups(std::pair<int, int> tied);
  // A chunk's context with hybrid sharding: the shard group's view of this rank.
  std::unique_ptr<RankContext> hybrid_context() const;
  // The fault a chunk's trainer injects itself (a NaN gradient in a unit it owns), and the check
  // that a named unit is on the faulted rank (a kConfig Error otherwise, never a silent no-op).
  FaultInjection chunk_fault(const SubModule& part, bool last_chunk) const;
  void check_fault_unit_is_here() const;
  void run_action(Step& step, const Action& action);  // interpreter.cc
  void sum_tied();                                     // interpreter.cc
  void inject_fault(std::size_t action_index, std::size_t actions);

  RankContext& context_;
  EngineOptions engine_;
  PipelineOptions pipeline_;
  DeviceMesh mesh_;
  MeshCoordinate at_;
  Schedule schedule_;
  std::vector<std::unique_ptr<Module>> models_;  // per micro-batch: the whole model's copy
  std::vector<std::string> parameter_names_;
  std::vector<std::size_t> parameter_sizes_;
  std::vector<int> parameter_stage_;  // the pipeline stage that owns each parameter
  std::vector<ShardLayout> layouts_;
  std::vector<std::pair<std::size_t, std::size_t>> layout_units_;  // per layouts_: (chunk, unit)
  CheckpointPlacement placement_;
  std::unique_ptr<Communicator> data_parallel_;
  std::unique_ptr<Communicator> activations_;
  std::unique_ptr<Communicator> gradients_;
  std::unique_ptr<Communicator> tied_;  // null unless this rank holds a lent unit or its copy
  Communicator* tensor_ = nullptr;      // the model's tensor-parallel group; null for one rank
  std::unique_ptr<HybridCommunicator> hybrid_;  // over data_parallel_; null without hybrid sharding
  std::unique_ptr<Stream> send_activations_;
  std::unique_ptr<Stream> send_gradients_;
  std::vector<Chunk> chunks_;
  ZeroTrainer::StepTotals totals_;  // summed over the world by forward_backward
  bool step_pending_ = false;
  // This rank's units tied across pipeline stages: (whole model's index, chunk, unit of the chunk),
  // in the whole model's order.
  std::vector<std::tuple<int, std::size_t, std::size_t>> tied_units_;
  bool skip_tied_sum_ = false;
  ReceivedShapes received_shapes_;  // empty but on the shape-only device
};

}  // namespace zest
