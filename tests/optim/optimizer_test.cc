// make_optimizer and the optimizer classes: types and their canonical names, state counts,
// config validation messages (JSON paths), that update() runs the kernels with the per-range
// weight decay switch, and that update_and_round() writes what convert() of the update would.
#include "optim/optimizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "base/error.h"
#include "kernels/adamw.h"
#include "kernels/convert.h"
#include "kernels/sgd.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "runtime/cpu_device.h"

namespace zest {
namespace {

Error config_error(const OptimizerOptions& options) {
  try {
    make_optimizer(options);
  } catch (const Error& error) {
    return error;
  }
  ADD_FAILURE() << "expected a config Error";
  return Error(ErrorKind::kInternal, "(none thrown)");
}

OptimizerOptions with_type(const std::string& type) {
  OptimizerOptions options;
  options.type = type;
  return options;
}

TEST(MakeOptimizer, MakesEachTypeUnderItsCanonicalName) {
  EXPECT_EQ(make_optimizer(with_type("AdamW"))->name(), "AdamW");
  EXPECT_EQ(make_optimizer(with_type("Adam"))->name(), "Adam");
  EXPECT_EQ(make_optimizer(with_type("SGD"))->name(), "SGD");
  EXPECT_NE(dynamic_cast<AdamW*>(make_optimizer(with_type("AdamW")).get()), nullptr);
  EXPECT_NE(dynamic_cast<Adam*>(make_optimizer(with_type("Adam")).get()), nullptr);
  EXPECT_NE(dynamic_cast<Sgd*>(make_optimizer(with_type("SGD")).get()), nullptr);
}

TEST(MakeOptimizer, TypeNamesAreCaseInsensitive) {
  EXPECT_EQ(make_optimizer(with_type("adamw"))->name(), "AdamW");
  EXPECT_EQ(make_optimizer(with_type("ADAM"))->name(), "Adam");
  EXPECT_EQ(make_optimizer(with_type("sgd"))->options().type, "SGD");
}

TEST(MakeOptimizer, UnknownTypeNamesTheKeyAndTheAllowedTypes) {
  const Error error = config_error(with_type("Foo"));
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_STREQ(error.what(), "optimizer.type: unknown optimizer 'Foo' (allowed: AdamW, Adam, SGD)");
  EXPECT_EQ(config_error(with_type("AdamWX")).kind(), ErrorKind::kConfig);
  EXPECT_EQ(config_error(with_type("")).kind(), ErrorKind::kConfig);
}

TEST(MakeOptimizer, StateCountIsTwoForAdamAndMomentumForSgd) {
  EXPECT_EQ(make_optimizer(with_type("AdamW"))->state_count(), 2u);
  EXPECT_EQ(make_optimizer(with_type("Adam"))->state_count(), 2u);
  OptimizerOptions sgd = with_type("SGD");
  EXPECT_EQ(make_optimizer(sgd)->state_count(), 0u);
  sgd.momentum = 0.9f;
  EXPECT_EQ(make_optimizer(sgd)->state_count(), 1u);
}

TEST(MakeOptimizer, OutOfRangeValuesNameTheirJsonPath) {
  OptimizerOptions options = with_type("AdamW");
  options.lr = -1.0f;
  EXPECT_STREQ(config_error(options).what(), "optimizer.params.lr: must be > 0, got -1");

  options = with_type("Adam");
  options.beta1 = 1.0f;
  EXPECT_STREQ(config_error(options).what(), "optimizer.params.betas[0]: must be in [0, 1), got 1");
  options = with_type("AdamW");
  options.beta2 = -0.5f;
  EXPECT_STREQ(config_error(options).what(),
               "optimizer.params.betas[1]: must be in [0, 1), got -0.5");
  options = with_type("AdamW");
  options.eps = -1e-8f;
  EXPECT_THAT(config_error(options).what(), ::testing::StartsWith("optimizer.params.eps: "));
  options = with_type("SGD");
  options.weight_decay = -0.1f;
  EXPECT_STREQ(config_error(options).what(),
               "optimizer.params.weight_decay: must be >= 0, got -0.1");
  options = with_type("SGD");
  options.momentum = -0.9f;
  EXPECT_STREQ(config_error(options).what(), "optimizer.params.momentum: must be >= 0, got -0.9");
  options = with_type("SGD");
  options.nesterov = true;
  EXPECT_STREQ(config_error(options).what(), "optimizer.params.nesterov: requires momentum > 0");
  options = with_type("AdamW");
  options.lr = std::nanf("");
  EXPECT_EQ(config_error(options).kind(), ErrorKind::kConfig);
}

TEST(MakeOptimizer, ClassesValidateWhenBuiltDirectly) {
  OptimizerOptions options;
  options.lr = 0.0f;
  EXPECT_THROW(AdamW{options}, Error);
  EXPECT_THROW(Sgd{options}, Error);
}

// Runs `optimizer` for 3 steps via update() and the kernel directly; both must agree bitwise.
TEST(OptimizerUpdate, AdamWRunsTheKernelWithDecayOnlyWhereAsked) {
  OptimizerOptions options = with_type("AdamW");
  options.weight_decay = 0.1f;
  auto optimizer = make_optimizer(options);
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  for (bool decay : {true, false}) {
    std::vector<float> p(50, 1.0f), g(50, 0.3f), m(50, 0.0f), v(50, 0.0f);
    std::vector<float> kp = p, km = m, kv = v;
    UpdateArgs args;
    args.lr = 0.01f;
    args.decay = decay;
    args.grad_scale = 0.5f;
    AdamWArgs kernel;
    kernel.lr = 0.01f;
    kernel.weight_decay = decay ? 0.1f : 0.0f;
    kernel.grad_scale = 0.5f;
    for (std::int64_t step = 1; step <= 3; ++step) {
      args.step = kernel.step = step;
      optimizer->update(*stream, p.data(), g.data(), {m.data(), v.data()}, p.size(), args);
      cpu::adamw(kp.data(), g.data(), km.data(), kv.data(), kp.size(), kernel);
    }
    stream->synchronize();
    EXPECT_EQ(p, kp) << "decay=" << decay;
    EXPECT_EQ(m, km);
    EXPECT_EQ(v, kv);
  }
}

TEST(OptimizerUpdate, AdamAddsDecayToTheGradientInsteadOfTheWeights) {
  OptimizerOptions options;
  options.weight_decay = 0.5f;
  options.type = "AdamW";
  auto adamw = make_optimizer(options);
  options.type = "Adam";
  auto adam = make_optimizer(options);
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  // Zero gradient: AdamW only shrinks p by lr*wd; Adam's L2 gradient moves it by ~lr.
  std::vector<float> p1(4, 2.0f), p2(4, 2.0f), g(4, 0.0f), m1(4), v1(4), m2(4), v2(4);
  UpdateArgs args;
  args.lr = 0.01f;
  adamw->update(*stream, p1.data(), g.data(), {m1.data(), v1.data()}, 4, args);
  adam->update(*stream, p2.data(), g.data(), {m2.data(), v2.data()}, 4, args);
  stream->synchronize();
  EXPECT_FLOAT_EQ(p1[0], 2.0f * (1.0f - 0.01f * 0.5f));
  EXPECT_NEAR(p2[0], 2.0f - 0.01f, 1e-6f);
}

TEST(OptimizerUpdate, SgdRunsTheKernelWithAndWithoutMomentum) {
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  for (float momentum : {0.0f, 0.9f}) {
    OptimizerOptions options = with_type("SGD");
    options.momentum = momentum;
    options.nesterov = momentum > 0;
    options.weight_decay = 0.01f;
    auto optimizer = make_optimizer(options);
    std::vector<float> p(40, 1.0f), g(40, -0.2f), buf(40), kp = p, kbuf = buf;
    std::vector<float*> state;
    if (momentum > 0) state.push_back(buf.data());
    UpdateArgs args;
    args.lr = 0.1f;
    SgdArgs kernel;
    kernel.lr = 0.1f;
    kernel.momentum = momentum;
    kernel.nesterov = momentum > 0;
    kernel.weight_decay = 0.01f;
    for (std::int64_t step = 1; step <= 3; ++step) {
      args.step = kernel.step = step;
      optimizer->update(*stream, p.data(), g.data(), state, p.size(), args);
      cpu::sgd(kp.data(), g.data(), momentum > 0 ? kbuf.data() : nullptr, kp.size(), kernel);
    }
    stream->synchronize();
    EXPECT_EQ(p, kp) << "momentum=" << momentum;
    EXPECT_EQ(buf, kbuf);
  }
}

// Mixed precision's step: Adam/AdamW write the 2-byte copy in the kernel's pass, SGD by the
// default (update, then convert); either way it must be convert() of the updated fp32 master.
TEST(OptimizerUpdate, UpdateAndRoundWritesConvertOfTheUpdatedMaster) {
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  for (const char* type : {"AdamW", "Adam", "SGD"}) {
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      SCOPED_TRACE(testing::Message() << type << " " << dtype_name(dtype));
      OptimizerOptions options = with_type(type);
      options.weight_decay = 0.1f;
      options.momentum = 0.9f;
      auto optimizer = make_optimizer(options);
      const std::size_t n = 77;
      std::vector<float> p(n), g(n), fused_p(n), m(n), v(n), fused_m(n), fused_v(n);
      for (std::size_t i = 0; i < n; ++i) {
        p[i] = fused_p[i] = 1.0f + 0.01f * static_cast<float>(i);
        g[i] = 0.3f - 0.005f * static_cast<float>(i);
      }
      std::vector<float*> state = {m.data(), v.data()};
      std::vector<float*> fused_state = {fused_m.data(), fused_v.data()};
      state.resize(optimizer->state_count());
      fused_state.resize(optimizer->state_count());
      std::vector<std::uint16_t> rounded(n), converted(n);
      UpdateArgs args;
      args.lr = 0.01f;
      for (std::int64_t step = 1; step <= 2; ++step) {
        args.step = step;
        optimizer->update(*stream, p.data(), g.data(), state, n, args);
        optimizer->update_and_round(*stream, fused_p.data(), g.data(), fused_state, n, args,
                                    rounded.data(), dtype);
      }
      stream->synchronize();
      cpu::convert(p.data(), DType::kFloat32, converted.data(), dtype, n);
      EXPECT_EQ(fused_p, p);
      EXPECT_EQ(rounded, converted);
    }
  }
}

TEST(OptimizerUpdate, WrongNumberOfStateArraysIsAUsageError) {
  auto optimizer = make_optimizer(with_type("AdamW"));
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  std::vector<float> p(4), g(4), m(4);
  try {
    optimizer->update(*stream, p.data(), g.data(), {m.data()}, 4, UpdateArgs{});
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUsage);
    EXPECT_THAT(error.what(), ::testing::HasSubstr("2 non-null state arrays, got 1"));
  }
}

}  // namespace
}  // namespace zest
