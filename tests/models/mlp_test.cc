// The MLP against an independent float64 re-implementation: its loss, and its analytic fp32
// gradients (every parameter and the input) against central differences of the float64 loss.
// Runs the units through tests/support/unit_harness.h, without the engine.
#include "models/mlp.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <vector>

#include "base/error.h"
#include "tests/support/unit_harness.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using testing::UnitHarness;

double gelu64(double x) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

// The MLP's forward loss in float64, written from the model's definition, not from its code.
struct Reference {
  std::vector<std::int64_t> sizes;
  std::vector<std::vector<double>> weights, biases;  // per layer: [out * in], [out]
  std::vector<double> inputs;                        // [rows * sizes[0]]
  std::vector<std::int32_t> targets;

  std::int64_t rows() const { return static_cast<std::int64_t>(targets.size()); }

  double loss() const {
    std::vector<double> h = inputs;
    const std::size_t layers = sizes.size() - 1;
    for (std::size_t l = 0; l < layers; ++l) {
      const std::int64_t in = sizes[l], out = sizes[l + 1];
      std::vector<double> z(rows() * out);
      for (std::int64_t r = 0; r < rows(); ++r) {
        for (std::int64_t o = 0; o < out; ++o) {
          double sum = biases[l][o];
          for (std::int64_t i = 0; i < in; ++i) sum += h[r * in + i] * weights[l][o * in + i];
          z[r * out + o] = l + 1 < layers ? gelu64(sum) : sum;
        }
      }
      h = std::move(z);
    }
    return mean_cross_entropy(h, sizes.back());
  }

  double mean_cross_entropy(const std::vector<double>& logits, std::int64_t classes) const {
    double total = 0.0;
    for (std::int64_t r = 0; r < rows(); ++r) {
      double sum = 0.0;
      for (std::int64_t c = 0; c < classes; ++c) sum += std::exp(logits[r * classes + c]);
      total += std::log(sum) - logits[r * classes + targets[r]];
    }
    return total / static_cast<double>(rows());
  }
};

// Central difference of the float64 loss with respect to `value` (an element of `reference`).
// h = 1e-6: truncation ~h^2 * |f'''| ~ 1e-12 and rounding ~1e-16 / h ~ 1e-10, far below fp32.
double numeric_derivative(Reference& reference, double& value) {
  const double h = 1e-6, saved = value;
  value = saved + h;
  const double plus = reference.loss();
  value = saved - h;
  const double minus = reference.loss();
  value = saved;
  return (plus - minus) / (2.0 * h);
}

struct Data {
  std::vector<float> inputs;
  std::vector<std::int32_t> targets;
  Batch batch() {
    Batch b;
    const auto rows = static_cast<std::int64_t>(targets.size());
    b.inputs = Tensor{
        inputs.data(), {rows, static_cast<std::int64_t>(inputs.size()) / rows}, DType::kFloat32};
    b.targets = Tensor{targets.data(), {rows}, DType::kInt32};
    return b;
  }
};

Data make_data(std::int64_t rows, std::int64_t features, std::int64_t classes) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Data data{std::vector<float>(rows * features), std::vector<std::int32_t>(rows)};
  for (float& x : data.inputs) x = normal(rng);
  for (std::int64_t r = 0; r < rows; ++r) data.targets[r] = static_cast<std::int32_t>(r % classes);
  return data;
}

Reference make_reference(UnitHarness& harness, const MlpConfig& config, const Data& data) {
  Reference reference{config.sizes, {}, {}, {data.inputs.begin(), data.inputs.end()}, data.targets};
  for (std::size_t u = 0; u < harness.unit_count(); ++u) {
    const Tensor w = harness.param(u, 0), b = harness.param(u, 1);
    reference.weights.emplace_back(w.as<float>(), w.as<float>() + w.numel());
    reference.biases.emplace_back(b.as<float>(), b.as<float>() + b.numel());
  }
  return reference;
}

// The fp32 forward and backward round each term (of size <= ~0.3 here) to 6e-8 relative, so
// gradients of 1e-4..1e-1 come out within ~2e-8 absolute of the float64 differences (measured);
// a wrong formula errs by far more. 1e-3 relative, with an absolute floor of 1e-7 for
// gradients that cancel to near 0 (where relative error means nothing), keeps a 5x margin.
void expect_gradient(float analytic, double numeric, const std::string& what) {
  EXPECT_NEAR(analytic, numeric, 1e-3 * std::abs(numeric) + 1e-7) << what;
}

class MlpGradient : public ::testing::TestWithParam<std::vector<std::int64_t>> {};

TEST_P(MlpGradient, MatchesCentralDifferencesOfFloat64Loss) {
  MlpConfig config{GetParam(), /*input_gradient=*/true};
  Mlp model(config);
  UnitHarness harness(model);
  Data data = make_data(5, config.sizes.front(), config.sizes.back());
  Reference reference = make_reference(harness, config, data);
  const float loss = harness.run(data.batch());
  // The float64 loss from the same fp32 values: fp32 rounding only, 1e-5 relative.
  EXPECT_NEAR(loss, reference.loss(), 1e-5 * reference.loss());

  for (std::size_t u = 0; u < harness.unit_count(); ++u) {
    const float* dw = harness.grad(u, 0).as<float>();
    const float* db = harness.grad(u, 1).as<float>();
    for (std::size_t i = 0; i < reference.weights[u].size(); ++i) {
      expect_gradient(dw[i], numeric_derivative(reference, reference.weights[u][i]),
                      "layer" + std::to_string(u) + ".weight[" + std::to_string(i) + "]");
    }
    for (std::size_t i = 0; i < reference.biases[u].size(); ++i) {
      expect_gradient(db[i], numeric_derivative(reference, reference.biases[u][i]),
                      "layer" + std::to_string(u) + ".bias[" + std::to_string(i) + "]");
    }
  }
  const std::vector<float>& dx = harness.grad_input(0);
  ASSERT_EQ(dx.size(), reference.inputs.size());
  for (std::size_t i = 0; i < dx.size(); ++i) {
    expect_gradient(dx[i], numeric_derivative(reference, reference.inputs[i]),
                    "input[" + std::to_string(i) + "]");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MlpGradient,
                         ::testing::Values(std::vector<std::int64_t>{6, 9, 7, 4},
                                           std::vector<std::int64_t>{4, 3},
                                           std::vector<std::int64_t>{3, 16, 2}));

TEST(Mlp, ParameterSpecsAreWeightAndBiasPerLayer) {
  Mlp model(MlpConfig{{10, 20, 5}});
  const std::vector<Unit*> units = model.units();
  ASSERT_EQ(units.size(), 2u);
  const std::int64_t in[] = {10, 20}, out[] = {20, 5};
  for (std::size_t u = 0; u < 2; ++u) {
    EXPECT_EQ(units[u]->name(), "layer" + std::to_string(u));
    const std::vector<ParamSpec> specs = units[u]->parameters();
    ASSERT_EQ(specs.size(), 2u);
    EXPECT_EQ(specs[0].name, "weight");
    EXPECT_EQ(specs[0].shape, (std::vector<std::int64_t>{out[u], in[u]}));
    EXPECT_TRUE(specs[0].weight_decay);
    EXPECT_EQ(specs[1].name, "bias");
    EXPECT_EQ(specs[1].shape, (std::vector<std::int64_t>{out[u]}));
    EXPECT_FALSE(specs[1].weight_decay);
    for (const ParamSpec& spec : specs) {
      const float bound = 1.0f / std::sqrt(static_cast<float>(in[u]));
      EXPECT_EQ(spec.init.kind, Initializer::Kind::kUniform);
      EXPECT_FLOAT_EQ(spec.init.a, -bound);
      EXPECT_FLOAT_EQ(spec.init.b, bound);
    }
  }
  EXPECT_EQ(model.parameter_count(), 11 * 20 + 21 * 5);
  EXPECT_EQ(model.describe(), "Mlp 10-20-5: 2 layers, 325 parameters");
}

Error construction_error(std::vector<std::int64_t> sizes) {
  try {
    Mlp model(MlpConfig{std::move(sizes)});
  } catch (const Error& error) {
    return error;
  }
  ADD_FAILURE() << "expected a config Error";
  return Error(ErrorKind::kInternal, "(none thrown)");
}

TEST(Mlp, BadSizesAreConfigErrorsNamingTheKey) {
  EXPECT_EQ(construction_error({}).kind(), ErrorKind::kConfig);
  EXPECT_THAT(construction_error({}).what(), HasSubstr("model.sizes: needs at least 2 entries"));
  EXPECT_THAT(construction_error({8}).what(), HasSubstr("got 1"));
  EXPECT_STREQ(construction_error({8, 0, 3}).what(),
               "model.sizes[1]: must be in [1, 2147483647], got 0");
  EXPECT_THAT(construction_error({8, 4, -2}).what(), HasSubstr("model.sizes[2]"));
  EXPECT_EQ(construction_error({8, 4, -2}).kind(), ErrorKind::kConfig);
}

TEST(Mlp, GradientsAccumulateAcrossRuns) {
  Mlp model(MlpConfig{{5, 8, 3}});
  UnitHarness harness(model);
  Data data = make_data(4, 5, 3);
  harness.run(data.batch());
  std::vector<std::vector<float>> once;
  for (std::size_t u = 0; u < 2; ++u) {
    for (std::size_t p = 0; p < 2; ++p) {
      const Tensor g = harness.grad(u, p);
      once.emplace_back(g.as<float>(), g.as<float>() + g.numel());
    }
  }
  harness.run(data.batch());
  std::size_t k = 0;
  for (std::size_t u = 0; u < 2; ++u) {
    for (std::size_t p = 0; p < 2; ++p, ++k) {
      const Tensor g = harness.grad(u, p);
      for (std::size_t i = 0; i < g.numel(); ++i) {
        // Summation order inside sgemm may differ between beta = 1 over 0 and over g: 1e-6.
        ASSERT_NEAR(g.as<float>()[i], 2.0f * once[k][i], 1e-6f * std::abs(once[k][i]) + 1e-9f);
      }
    }
  }
}

TEST(Mlp, LossScaleScalesEveryGradient) {
  Mlp plain_model(MlpConfig{{5, 8, 3}}), scaled_model(MlpConfig{{5, 8, 3}});
  UnitHarness plain(plain_model), scaled(scaled_model);
  scaled.set_loss_scale(1024.0f);
  Data data = make_data(4, 5, 3);
  EXPECT_EQ(plain.run(data.batch()), scaled.run(data.batch()));  // the loss is not scaled
  for (std::size_t u = 0; u < 2; ++u) {
    for (std::size_t p = 0; p < 2; ++p) {
      const Tensor a = plain.grad(u, p), b = scaled.grad(u, p);
      for (std::size_t i = 0; i < a.numel(); ++i) {
        // A power of two scales exactly except where 1024/B rounds differently from 1/B.
        ASSERT_NEAR(b.as<float>()[i], 1024.0f * a.as<float>()[i],
                    1e-6f * std::abs(1024.0f * a.as<float>()[i]) + 1e-9f);
      }
    }
  }
}

TEST(Mlp, ReleasesWhatItKeptForBackward) {
  Mlp model(MlpConfig{{5, 8, 3}});
  UnitHarness harness(model);
  Data data = make_data(4, 5, 3);
  harness.device().allocator().reset_peaks();
  harness.run(data.batch());
  const MemoryUsage usage = harness.device().allocator().usage();
  // Both layers kept z (4x8 and 4x3 floats) as activations, and handed it back after backward.
  EXPECT_GE(usage.peak_of(Category::kActivations), (4u * 8 + 4u * 3) * sizeof(float));
  EXPECT_EQ(usage.current_of(Category::kActivations), 0u);
}

TEST(Mlp, FirstLayerMakesAnInputGradientOnlyWhenAsked) {
  Mlp model(MlpConfig{{5, 8, 3}});
  UnitHarness harness(model);
  Data data = make_data(4, 5, 3);
  harness.run(data.batch());
  EXPECT_TRUE(harness.grad_input(0).empty());
  EXPECT_EQ(harness.grad_input(1).size(), 4u * 8);  // layer1 always feeds layer0's backward
}

TEST(Mlp, TargetOutOfRangeFailsTheRunWithADataError) {
  Mlp model(MlpConfig{{5, 8, 3}});
  UnitHarness harness(model);
  Data data = make_data(4, 5, 3);
  data.targets[3] = 3;
  try {
    harness.run(data.batch());
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kData);
    EXPECT_THAT(error.what(), HasSubstr("row 3"));
  }
}

TEST(Mlp, InputOfTheWrongWidthIsAUsageError) {
  Mlp model(MlpConfig{{5, 8, 3}});
  UnitHarness harness(model);
  Data data = make_data(4, 6, 3);  // 6 features for a 5-input model
  try {
    harness.run(data.batch());
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUsage);
    EXPECT_THAT(error.what(), HasSubstr("layer0: input must be float32 [B, 5]"));
  }
}

}  // namespace
}  // namespace zest
