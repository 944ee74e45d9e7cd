// A model with a layer the built-ins do not have, trained at ZeRO-3 on several local ranks: a
// gated MLP block (GEGLU, as in T5 v1.1 and PaLM's SwiGLU family) with a residual,
//     y = x + (gelu(x·Wgᵀ) ⊙ (x·Wuᵀ))·Wdᵀ,
// written against the Module / Unit contract (engine/module.h). The engine owns the parameters
// and gradients in flat buffers, gathers each unit before its call and reduces its gradients
// after; a unit only enqueues its math on context.stream() and accumulates its gradients.
// Usage: custom_module [--ranks N] [--steps N]. Exits 1 unless the loss falls.
#include <zest/zest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/synthetic_classification.h"
#include "kernels/bias.h"
#include "kernels/blas_core.h"
#include "kernels/cross_entropy.h"
#include "kernels/gelu.h"
#include "kernels/matmul.h"

namespace {

using zest::Buffer;
using zest::Category;
using zest::DType;
using zest::Stream;
using zest::Tensor;
using zest::UnitContext;

// Work of our own on the stream, for the one step no library kernel does (an elementwise
// product). A closure runs in stream order on the CPU device; a CUDA build would launch a kernel
// on the stream's cudaStream_t here instead.
void enqueue_copy(Stream& stream, float* to, const float* from, std::size_t count) {
  stream.enqueue([=] { std::memcpy(to, from, count * sizeof(float)); });
}

// The gated block: parameters gate.weight [H, C], up.weight [H, C], down.weight [C, H].
class GegluBlock final : public zest::Unit {
 public:
  GegluBlock(std::string name, std::int64_t width, std::int64_t hidden, bool first)
      : name_(std::move(name)), width_(width), hidden_(hidden), first_(first) {}

  const std::string& name() const override { return name_; }

  std::vector<zest::ParamSpec> parameters() const override {
    const float in_bound = 1.0f / std::sqrt(static_cast<float>(width_));
    const float out_bound = 1.0f / std::sqrt(static_cast<float>(hidden_));
    return {{"gate.weight", {hidden_, width_}, zest::Initializer::uniform(-in_bound, in_bound)},
            {"up.weight", {hidden_, width_}, zest::Initializer::uniform(-in_bound, in_bound)},
            {"down.weight", {width_, hidden_}, zest::Initializer::uniform(-out_bound, out_bound)}};
  }

  void forward(UnitContext& context) override {
    const Tensor x = context.input();
    const std::int64_t rows = x.dim(0);
    const std::size_t hidden_elements = static_cast<std::size_t>(rows * hidden_);
    if (!saved_.empty()) context.release(std::move(saved_));  // a forward without a backward
    // Everything is allocated before any work is enqueued, so an out-of-memory leaves no work
    // behind that writes into a buffer the unwinding frees.
    Buffer saved = context.allocate(2 * hidden_elements * sizeof(float), Category::kActivations);
    Buffer scratch = context.allocate(hidden_elements * sizeof(float), Category::kWorkspace);
    float* y = context.make_output({rows, width_}, DType::kFloat32).as<float>();
    saved_ = std::move(saved);
    float* g = saved_.as<float>();  // kept for backward: the gate's and the up projection's
    float* u = g + hidden_elements;
    float* h = scratch.as<float>();
    Stream& stream = context.stream();
    const float* in = x.as<const float>();

    zest::matmul(stream, false, true, rows, hidden_, width_, 1.0f, in,
                 context.param(0).as<const float>(), 0.0f, g);
    zest::matmul(stream, false, true, rows, hidden_, width_, 1.0f, in,
                 context.param(1).as<const float>(), 0.0f, u);
    zest::gelu_forward(stream, g, h, hidden_elements);
    stream.enqueue([=] {
      for (std::size_t i = 0; i < hidden_elements; ++i) h[i] *= u[i];
    });
    enqueue_copy(stream, y, in, static_cast<std::size_t>(rows * width_));  // the residual
    zest::matmul(stream, false, true, rows, width_, hidden_, 1.0f, h,
                 context.param(2).as<const float>(), 1.0f, y);
    context.release(std::move(scratch));
    if (!context.backward_follows()) context.release(std::move(saved_));
  }

  void backward(UnitContext& context) override {
    const Tensor x = context.input();
    const std::int64_t rows = x.dim(0);
    const std::size_t hidden_elements = static_cast<std::size_t>(rows * hidden_);
    const std::size_t width_elements = static_cast<std::size_t>(rows * width_);
    Buffer scratch = context.allocate(3 * hidden_elements * sizeof(float), Category::kWorkspace);
    // The first unit's input is the batch: nobody needs its gradient.
    float* dx = first_ ? nullptr
                       : context.make_grad_input({rows, width_}, DType::kFloat32).as<float>();
    float* g = saved_.as<float>();
    float* u = g + hidden_elements;
    float* a = scratch.as<float>();   // gelu(g), then d(gelu(g))
    float* h = a + hidden_elements;   // a ⊙ u
    float* dh = h + hidden_elements;  // d(h), then d(u)
    const float* dy = context.grad_output().as<const float>();
    const float* in = x.as<const float>();
    Stream& stream = context.stream();

    zest::gelu_forward(stream, g, a, hidden_elements);
    stream.enqueue([=] {
      for (std::size_t i = 0; i < hidden_elements; ++i) h[i] = a[i] * u[i];
    });
    // Gradients are accumulated (beta 1): micro-batches and tied weights add up.
    zest::matmul(stream, true, false, width_, hidden_, rows, 1.0f, dy, h, 1.0f,
                 context.grad(2).as<float>());
    zest::matmul(stream, false, false, rows, hidden_, width_, 1.0f, dy,
                 context.param(2).as<const float>(), 0.0f, dh);
    stream.enqueue([=] {
      for (std::size_t i = 0; i < hidden_elements; ++i) {
        const float d = dh[i];
        dh[i] = d * a[i];  // d(u)
        a[i] = d * u[i];   // d(gelu(g))
      }
    });
    zest::gelu_backward(stream, g, a, g, hidden_elements);  // g becomes d(g)
    zest::matmul(stream, true, false, hidden_, width_, rows, 1.0f, dh, in, 1.0f,
                 context.grad(1).as<float>());
    zest::matmul(stream, true, false, hidden_, width_, rows, 1.0f, g, in, 1.0f,
                 context.grad(0).as<float>());
    if (dx != nullptr) {
      enqueue_copy(stream, dx, dy, width_elements);  // through the residual
      zest::matmul(stream, false, false, rows, width_, hidden_, 1.0f, dh,
                   context.param(1).as<const float>(), 1.0f, dx);
      zest::matmul(stream, false, false, rows, width_, hidden_, 1.0f, g,
                   context.param(0).as<const float>(), 1.0f, dx);
    }
    context.release(std::move(scratch));
    context.release(std::move(saved_));
  }

 private:
  const std::string name_;
  const std::int64_t width_, hidden_;
  const bool first_;
  Buffer saved_;  // g and u from forward, category activations
};

// The classifier: logits = x·Wᵀ + b and their mean cross-entropy, which the last unit writes.
class Head final : public zest::Unit {
 public:
  Head(std::int64_t width, std::int64_t classes) : width_(width), classes_(classes) {}

  const std::string& name() const override { return name_; }

  std::vector<zest::ParamSpec> parameters() const override {
    const float bound = 1.0f / std::sqrt(static_cast<float>(width_));
    const zest::Initializer init = zest::Initializer::uniform(-bound, bound);
    return {{"weight", {classes_, width_}, init, true}, {"bias", {classes_}, init, false}};
  }

  void forward(UnitContext& context) override {
    const Tensor x = context.input();
    const std::int64_t rows = x.dim(0);
    if (!saved_.empty()) context.release(std::move(saved_));
    saved_ = context.allocate(static_cast<std::size_t>(rows * classes_) * sizeof(float),
                              Category::kActivations);
    float* logits = saved_.as<float>();
    Stream& stream = context.stream();
    zest::matmul(stream, false, true, rows, classes_, width_, 1.0f, x.as<const float>(),
                 context.param(0).as<const float>(), 0.0f, logits);
    zest::add_bias(stream, logits, context.param(1).as<const float>(), rows, classes_);
    zest::cross_entropy_forward(stream, logits, context.batch().targets.as<const std::int32_t>(),
                                rows, classes_, context.loss());
    if (!context.backward_follows()) context.release(std::move(saved_));
  }

  void backward(UnitContext& context) override {
    const Tensor x = context.input();
    const std::int64_t rows = x.dim(0);
    float* dx = context.make_grad_input({rows, width_}, DType::kFloat32).as<float>();
    float* dlogits = saved_.as<float>();  // the logits become their gradient in place
    Stream& stream = context.stream();
    // loss_scale() folds in 1 / gradient-accumulation steps (and fp16's loss scale).
    zest::cross_entropy_backward(stream, dlogits, context.batch().targets.as<const std::int32_t>(),
                                 rows, classes_, context.loss_scale(), dlogits);
    zest::matmul(stream, true, false, classes_, width_, rows, 1.0f, dlogits, x.as<const float>(),
                 1.0f, context.grad(0).as<float>());
    zest::bias_grad(stream, dlogits, context.grad(1).as<float>(), rows, classes_);
    zest::matmul(stream, false, false, rows, width_, classes_, 1.0f, dlogits,
                 context.param(0).as<const float>(), 0.0f, dx);
    context.release(std::move(saved_));
  }

 private:
  const std::string name_ = "head";
  const std::int64_t width_, classes_;
  Buffer saved_;
};

// The Module is the ordered list of units: what is gathered and reduced together.
class GegluClassifier final : public zest::Module {
 public:
  GegluClassifier(std::int64_t width, std::int64_t hidden, std::int64_t classes, int blocks) {
    for (int b = 0; b < blocks; ++b) {
      units_.push_back(
          std::make_unique<GegluBlock>("glu" + std::to_string(b), width, hidden, b == 0));
    }
    units_.push_back(std::make_unique<Head>(width, classes));
  }

  std::vector<zest::Unit*> units() override {
    std::vector<zest::Unit*> units;
    for (const auto& unit : units_) units.push_back(unit.get());
    return units;
  }

 private:
  std::vector<std::unique_ptr<zest::Unit>> units_;
};

}  // namespace

int main(int argc, char** argv) try {
  zest::select_openblas_core();
  int ranks = 4, steps = 40;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--ranks") ranks = std::atoi(argv[i + 1]);
    else if (flag == "--steps") steps = std::atoi(argv[i + 1]);
    else throw zest::Error(zest::ErrorKind::kUsage, "unknown flag " + flag);
  }

  constexpr std::int64_t kWidth = 16, kHidden = 32, kClasses = 4, kGlobalBatch = 64;
  const zest::SyntheticClassification task({kWidth, kClasses, /*seed=*/7});
  zest::WorldOptions world;
  world.ranks = ranks;
  std::vector<float> losses(steps);
  std::vector<std::string> parameters;

  zest::World(world).run([&](zest::RankContext& rank) {
    GegluClassifier model(kWidth, kHidden, kClasses, /*blocks=*/2);
    zest::EngineOptions options;
    options.stage = 3;  // parameters, gradients and optimizer state all sharded
    zest::Engine engine(rank, options);
    zest::OptimizerOptions adamw;
    adamw.lr = 3e-3f;
    auto trainer = engine.shard(model, zest::make_optimizer(adamw));
    if (rank.rank == 0) parameters = trainer->parameter_names();
    for (int step = 1; step <= steps; ++step) {
      const zest::HostBatch batch =
          task.micro_batch(step, 0, 1, kGlobalBatch, rank.rank, rank.world_size);
      trainer->forward_backward(batch.batch());
      const zest::StepStats stats = trainer->step();
      if (rank.rank == 0) losses[step - 1] = stats.loss;
    }
  });

  std::printf("parameters:");
  for (const std::string& name : parameters) std::printf(" %s", name.c_str());
  std::printf("\n");
  for (int step = 1; step <= steps; ++step) std::printf("step %d loss %.4f\n", step, losses[step - 1]);
  const bool fell = std::isfinite(losses.back()) && losses.back() < 0.8f * losses.front();
  std::printf("custom_module: GEGLU blocks at ZeRO-3 on %d ranks: loss %.4f -> %.4f (%s)\n", ranks,
              losses.front(), losses.back(), fell ? "falls" : "DID NOT FALL");
  return fell ? 0 : 1;
} catch (const zest::Error& error) {
  std::fprintf(stderr, "custom_module: error: %s\n", error.what());
  return 2;
}
