// The GPT against an independent float64 re-implementation: its loss, and its analytic fp32
// gradients of every parameter element (the tied wte included) against central differences of
// the float64 loss; its parameter specs; and its config, shape and data errors. Runs the units
// through tests/support/unit_harness.h, without the engine.
#include "models/gpt.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "tests/support/unit_harness.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using testing::UnitHarness;

using Params = std::map<std::string, std::vector<double>>;  // full name -> values

// GPT-2's forward loss in float64, written from the architecture's definition (per-element
// loops, no shared code with the model): embedding, pre-LN blocks, ln_f, tied LM head, mean
// cross-entropy over every position.
struct Reference {
  GptConfig config;
  std::int64_t batch = 0, seq = 0;
  std::vector<std::int32_t> tokens, targets;  // [batch * seq]
  Params params;

  const std::vector<double>& p(const std::string& name) const { return params.at(name); }

  // [rows, C] -> [rows, C], GPT-2's norm with eps 1e-5 and the biased variance.
  std::vector<double> layernorm(const std::vector<double>& x, const std::string& prefix) const {
    const std::int64_t C = config.n_embd, rows = static_cast<std::int64_t>(x.size()) / C;
    const std::vector<double>& w = p(prefix + ".weight");
    const std::vector<double>& b = p(prefix + ".bias");
    std::vector<double> y(x.size());
    for (std::int64_t r = 0; r < rows; ++r) {
      double mean = 0.0, var = 0.0;
      for (std::int64_t c = 0; c < C; ++c) mean += x[r * C + c] / C;
      for (std::int64_t c = 0; c < C; ++c) var += (x[r * C + c] - mean) * (x[r * C + c] - mean) / C;
      for (std::int64_t c = 0; c < C; ++c) {
        y[r * C + c] = (x[r * C + c] - mean) / std::sqrt(var + 1e-5) * w[c] + b[c];
      }
    }
    return y;
  }

  // y = x Wᵀ + b with W [out, in] as torch.nn.Linear.
  std::vector<double> linear(const std::vector<double>& x, const std::string& prefix,
                             std::int64_t in, std::int64_t out) const {
    const std::vector<double>& w = p(prefix + ".weight");
    const std::vector<double>& b = p(prefix + ".bias");
    const std::int64_t rows = static_cast<std::int64_t>(x.size()) / in;
    std::vector<double> y(rows * out);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t o = 0; o < out; ++o) {
        double sum = b[o];
        for (std::int64_t i = 0; i < in; ++i) sum += x[r * in + i] * w[o * in + i];
        y[r * out + o] = sum;
      }
    }
    return y;
  }

  static double gelu(double x) {
    const double c = std::sqrt(2.0 / std::numbers::pi);
    return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
  }

  // qkv [B*T, 3C] -> [B*T, C]: per batch row and head, softmax(q·k / sqrt(d)) over earlier
  // positions (and itself), times v.
  std::vector<double> attention(const std::vector<double>& qkv) const {
    const std::int64_t C = config.n_embd, H = config.n_head, d = C / H;
    std::vector<double> y(batch * seq * C, 0.0);
    for (std::int64_t b = 0; b < batch; ++b) {
      for (std::int64_t h = 0; h < H; ++h) {
        for (std::int64_t i = 0; i < seq; ++i) {
          const double* q = &qkv[(b * seq + i) * 3 * C + h * d];
          std::vector<double> scores(i + 1);
          double max = -1e300, sum = 0.0;
          for (std::int64_t j = 0; j <= i; ++j) {
            const double* k = &qkv[(b * seq + j) * 3 * C + C + h * d];
            double dot = 0.0;
            for (std::int64_t e = 0; e < d; ++e) dot += q[e] * k[e];
            scores[j] = dot / std::sqrt(static_cast<double>(d));
            max = std::max(max, scores[j]);
          }
          for (double& s : scores) sum += (s = std::exp(s - max));
          for (std::int64_t j = 0; j <= i; ++j) {
            const double* v = &qkv[(b * seq + j) * 3 * C + 2 * C + h * d];
            for (std::int64_t e = 0; e < d; ++e) {
              y[(b * seq + i) * C + h * d + e] += scores[j] / sum * v[e];
            }
          }
        }
      }
    }
    return y;
  }

  double loss() const {
    const std::int64_t C = config.n_embd, V = config.vocab_size, N = batch * seq;
    const std::vector<double>& wte = p("embedding.wte");
    const std::vector<double>& wpe = p("embedding.wpe");
    std::vector<double> x(N * C);
    for (std::int64_t n = 0; n < N; ++n) {
      for (std::int64_t c = 0; c < C; ++c) {
        x[n * C + c] = wte[tokens[n] * C + c] + wpe[(n % seq) * C + c];
      }
    }
    for (int l = 0; l < config.n_layer; ++l) {
      const std::string block = "block" + std::to_string(l);
      const std::vector<double> qkv =
          linear(layernorm(x, block + ".ln_1"), block + ".attn.c_attn", C, 3 * C);
      const std::vector<double> a = linear(attention(qkv), block + ".attn.c_proj", C, C);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += a[i];
      std::vector<double> h = linear(layernorm(x, block + ".ln_2"), block + ".mlp.c_fc", C, 4 * C);
      for (double& v : h) v = gelu(v);
      const std::vector<double> m = linear(h, block + ".mlp.c_proj", 4 * C, C);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += m[i];
    }
    const std::vector<double> f = layernorm(x, "head.ln_f");
    double total = 0.0;
    for (std::int64_t n = 0; n < N; ++n) {
      std::vector<double> logits(V);
      double max = -1e300, sum = 0.0;
      for (std::int64_t v = 0; v < V; ++v) {
        for (std::int64_t c = 0; c < C; ++c) logits[v] += f[n * C + c] * wte[v * C + c];
        max = std::max(max, logits[v]);
      }
      for (double logit : logits) sum += std::exp(logit - max);
      total += std::log(sum) + max - logits[targets[n]];
    }
    return total / static_cast<double>(N);
  }
};

// Central difference of the float64 loss with respect to `value` (an element of the reference's
// parameters). h = 1e-6: truncation ~h^2 |f'''| ~ 1e-12, rounding ~1e-16 / h ~ 1e-10, both far
// below the fp32 errors under test.
double numeric_derivative(const Reference& reference, double& value) {
  const double h = 1e-6, saved = value;
  value = saved + h;
  const double plus = reference.loss();
  value = saved - h;
  const double minus = reference.loss();
  value = saved;
  return (plus - minus) / (2.0 * h);
}

const GptConfig kTiny{/*n_layer=*/2, /*n_head=*/2, /*n_embd=*/8, /*vocab_size=*/11, /*seq_len=*/5};

struct Tokens {
  std::int64_t batch, seq;
  std::vector<std::int32_t> inputs, targets;
  Batch batch_view() {
    return Batch{Tensor{inputs.data(), {batch, seq}, DType::kInt32},
                 Tensor{targets.data(), {batch, seq}, DType::kInt32}};
  }
};

Tokens make_tokens(std::int64_t batch, std::int64_t seq, int vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> token(0, vocab - 1);
  Tokens tokens{batch, seq, std::vector<std::int32_t>(batch * seq),
                std::vector<std::int32_t>(batch * seq)};
  for (auto& t : tokens.inputs) t = token(rng);
  for (auto& t : tokens.targets) t = token(rng);
  return tokens;
}

// GPT-2's init is deliberately small (std 0.02), which leaves attention near uniform and GELU
// near linear; larger random values make every path of the backward matter.
void randomize_parameters(UnitHarness& harness, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t u = 0; u < harness.unit_count(); ++u) {
    for (std::size_t i = 0; i < harness.specs(u).size(); ++i) {
      const ParamSpec& spec = harness.specs(u)[i];
      const Tensor value = harness.param(u, i);
      const bool norm_weight = spec.init.kind == Initializer::Kind::kOnes;
      const float scale = spec.shape.size() >= 2 ? 0.5f : 0.2f;
      for (std::size_t e = 0; e < value.numel(); ++e) {
        value.as<float>()[e] = (norm_weight ? 1.0f : 0.0f) + scale * normal(rng);
      }
    }
  }
}

Reference make_reference(UnitHarness& harness, const Tokens& tokens) {
  Reference reference{kTiny, tokens.batch, tokens.seq, tokens.inputs, tokens.targets, {}};
  const char* unit_names[] = {"embedding", "block0", "block1", "head"};
  for (std::size_t u = 0; u < harness.unit_count(); ++u) {
    for (std::size_t i = 0; i < harness.specs(u).size(); ++i) {
      const Tensor value = harness.param(u, i);
      reference.params[std::string(unit_names[u]) + "." + harness.specs(u)[i].name] =
          std::vector<double>(value.as<float>(), value.as<float>() + value.numel());
    }
  }
  return reference;
}

// Measured on this problem: the largest gap between the fp32 analytic gradients and the float64
// differences is 6.5e-7 absolute, for gradients up to ~1 (each fp32 term rounds at 6e-8
// relative, and a gradient sums many of them through two blocks, softmaxes and norms). A wrong
// formula, a missing term (e.g. the head's share of d(wte)) or a wrong index errs by 1e-3 or
// more. 1e-3 relative with a 3e-6 absolute floor (for elements that cancel to near 0, such as
// the key bias, whose true gradient is 0) keeps a ~5x margin over the measured gap.
void expect_gradient(float analytic, double numeric, const std::string& what) {
  EXPECT_NEAR(analytic, numeric, 1e-3 * std::abs(numeric) + 3e-6) << what;
}

class GptGradient : public ::testing::TestWithParam<int> {};

TEST_P(GptGradient, EveryParameterMatchesCentralDifferencesOfFloat64Loss) {
  const std::int64_t seq = GetParam();  // seq_len, or shorter (rows of wpe go unused)
  Gpt model(kTiny);
  UnitHarness harness(model);
  randomize_parameters(harness, 11);
  Tokens tokens = make_tokens(2, seq, kTiny.vocab_size, 5);
  Reference reference = make_reference(harness, tokens);
  const float loss = harness.run(tokens.batch_view());
  const double reference_loss = reference.loss();
  // The float64 loss of the same fp32 parameters: only fp32 rounding separates them.
  EXPECT_NEAR(loss, reference_loss, 1e-5 * reference_loss);

  std::size_t checked = 0;
  const char* unit_names[] = {"embedding", "block0", "block1", "head"};
  for (std::size_t u = 0; u < harness.unit_count(); ++u) {
    for (std::size_t i = 0; i < harness.specs(u).size(); ++i) {
      const std::string name = std::string(unit_names[u]) + "." + harness.specs(u)[i].name;
      const float* grad = harness.grad(u, i).as<const float>();
      std::vector<double>& values = reference.params.at(name);
      // Every element: the tiny model has 1923 parameters, a second's worth of differences.
      for (std::size_t e = 0; e < values.size(); ++e, ++checked) {
        expect_gradient(grad[e], numeric_derivative(reference, values[e]),
                        name + "[" + std::to_string(e) + "]");
      }
    }
  }
  EXPECT_EQ(checked, static_cast<std::size_t>(model.parameter_count()));
}

INSTANTIATE_TEST_SUITE_P(SequenceLengths, GptGradient, ::testing::Values(5, 3),
                         [](const auto& info) { return "T" + std::to_string(info.param); });

TEST(GptGradient, AccumulatesAcrossMicroBatchesAndFollowsTheLossScale) {
  // Two micro-batches at loss scale 0.5 must add up to one at scale 1: every kernel accumulates
  // (+=) into the gradients, the tied wte included, and the head seeds backward with the scale.
  Gpt model(kTiny);
  UnitHarness once(model), twice(model);
  randomize_parameters(once, 3);
  randomize_parameters(twice, 3);
  Tokens tokens = make_tokens(2, 5, kTiny.vocab_size, 9);
  const float loss = once.run(tokens.batch_view());
  twice.set_loss_scale(0.5f);
  EXPECT_EQ(twice.run(tokens.batch_view()), loss);
  EXPECT_EQ(twice.run(tokens.batch_view()), loss);
  for (std::size_t u = 0; u < once.unit_count(); ++u) {
    for (std::size_t i = 0; i < once.specs(u).size(); ++i) {
      const Tensor expected = once.grad(u, i), actual = twice.grad(u, i);
      for (std::size_t e = 0; e < expected.numel(); ++e) {
        // Only the order of fp32 sums differs (bias and norm gradients sum rows onto what the
        // first micro-batch left): a few ulp of the terms summed (<= ~0.3), hence the floor.
        EXPECT_NEAR(actual.as<float>()[e], expected.as<float>()[e],
                    1e-6 * std::abs(expected.as<float>()[e]) + 1e-7)
            << once.specs(u)[i].name << "[" << e << "] of unit " << u;
      }
    }
  }
}

TEST(Gpt, UnitsAndParametersFollowGpt2) {
  Gpt model(GptConfig{3, 2, 8, 11, 5});
  const std::vector<Unit*> units = model.units();
  ASSERT_EQ(units.size(), 5u);
  EXPECT_EQ(units[0]->name(), "embedding");
  EXPECT_EQ(units[1]->name(), "block0");
  EXPECT_EQ(units[3]->name(), "block2");
  EXPECT_EQ(units[4]->name(), "head");
  EXPECT_EQ(units[4]->borrowed_units(), std::vector<int>{0});  // the tied LM head
  for (std::size_t u = 0; u < 4; ++u) EXPECT_TRUE(units[u]->borrowed_units().empty());

  std::map<std::string, ParamSpec> specs;
  std::int64_t total = 0;
  for (Unit* unit : units) {
    for (const ParamSpec& spec : unit->parameters()) {
      total += static_cast<std::int64_t>(Tensor{nullptr, spec.shape, DType::kFloat32}.numel());
      specs[unit->name() + "." + spec.name] = spec;
    }
  }
  EXPECT_EQ(total, model.parameter_count());
  EXPECT_EQ(specs.size(), 2u + 3 * 12 + 2);
  using Shape = std::vector<std::int64_t>;
  EXPECT_EQ(specs.at("embedding.wte").shape, (Shape{11, 8}));
  EXPECT_EQ(specs.at("embedding.wpe").shape, (Shape{5, 8}));
  EXPECT_FLOAT_EQ(specs.at("embedding.wte").init.a, 0.02f);
  EXPECT_FLOAT_EQ(specs.at("embedding.wpe").init.a, 0.01f);
  EXPECT_EQ(specs.at("block1.attn.c_attn.weight").shape, (Shape{24, 8}));
  EXPECT_EQ(specs.at("block1.attn.c_proj.weight").shape, (Shape{8, 8}));
  EXPECT_EQ(specs.at("block1.mlp.c_fc.weight").shape, (Shape{32, 8}));
  EXPECT_EQ(specs.at("block1.mlp.c_proj.weight").shape, (Shape{8, 32}));
  EXPECT_EQ(specs.at("block1.mlp.c_fc.bias").shape, (Shape{32}));
  const float residual = 0.02f / std::sqrt(6.0f);  // 0.02 / sqrt(2 * n_layer)
  EXPECT_FLOAT_EQ(specs.at("block2.attn.c_proj.weight").init.a, residual);
  EXPECT_FLOAT_EQ(specs.at("block2.mlp.c_proj.weight").init.a, residual);
  EXPECT_FLOAT_EQ(specs.at("block2.mlp.c_fc.weight").init.a, 0.02f);
  for (const auto& [name, spec] : specs) {
    // Matrices decay and draw from a normal; vectors (biases, norms) do neither.
    const bool matrix = spec.shape.size() == 2;
    EXPECT_EQ(spec.weight_decay, matrix) << name;
    const bool norm_weight = name.ends_with("ln_1.weight") || name.ends_with("ln_2.weight") ||
                             name.ends_with("ln_f.weight");
    const Initializer::Kind kind = matrix        ? Initializer::Kind::kNormal
                                   : norm_weight ? Initializer::Kind::kOnes
                                                 : Initializer::Kind::kZeros;
    EXPECT_EQ(spec.init.kind, kind) << name;
  }
  EXPECT_EQ(Gpt(GptConfig{}).describe(),
            "Gpt 12L 12H 768C, vocab 50257, seq 1024: 124439808 parameters");
}

Error config_error(GptConfig config) {
  try {
    Gpt model(config);
  } catch (const Error& error) {
    return error;
  }
  ADD_FAILURE() << "expected a config Error";
  return Error(ErrorKind::kInternal, "(none thrown)");
}

TEST(Gpt, BadConfigsAreConfigErrorsNamingTheKey) {
  EXPECT_STREQ(config_error({12, 5, 768, 50257, 1024}).what(),
               "model.n_embd: must be divisible by model.n_head (768 % 5 != 0)");
  EXPECT_STREQ(config_error({0, 2, 8, 11, 5}).what(), "model.n_layer: must be >= 1, got 0");
  EXPECT_STREQ(config_error({1, -1, 8, 11, 5}).what(), "model.n_head: must be >= 1, got -1");
  EXPECT_STREQ(config_error({1, 2, 0, 11, 5}).what(), "model.n_embd: must be >= 1, got 0");
  EXPECT_STREQ(config_error({1, 2, 8, 0, 5}).what(), "model.vocab_size: must be >= 1, got 0");
  EXPECT_STREQ(config_error({1, 2, 8, 11, 0}).what(), "model.seq_len: must be >= 1, got 0");
  EXPECT_EQ(config_error({1, 2, 8, 11, 0}).kind(), ErrorKind::kConfig);
  EXPECT_EQ(config_error({12, 5, 768, 50257, 1024}).kind(), ErrorKind::kConfig);
}

// Runs one micro-batch of the tiny model and returns the Error it raises. `edit` may spoil the
// batch's views.
template <typename Edit>
Error run_error(Tokens tokens, Edit&& edit) {
  auto model = std::make_unique<Gpt>(kTiny);
  Error error(ErrorKind::kInternal, "(none thrown)");
  {
    UnitHarness harness(*model);
    Batch batch = tokens.batch_view();
    edit(batch);
    try {
      harness.run(batch);
      ADD_FAILURE() << "expected an Error";
    } catch (const Error& e) {
      error = e;
    }
    try {
      harness.stream().synchronize();
    } catch (const Error&) {
      // The stream's failure is the error caught above.
    }
    // Note: a step that failed between forward and backward leaves units holding activations
    // from the harness's allocator; they must go before it does.
    model.reset();
  }
  return error;
}

Error run_error(Tokens tokens) {
  return run_error(std::move(tokens), [](Batch&) {});
}

TEST(Gpt, TokenOutsideTheVocabularyIsADataErrorNamingPositionAndValue) {
  Tokens tokens = make_tokens(2, 4, kTiny.vocab_size, 1);
  tokens.inputs[1 * 4 + 2] = 11;
  const Error error = run_error(tokens);
  EXPECT_EQ(error.kind(), ErrorKind::kData);
  EXPECT_THAT(error.what(),
              HasSubstr("token at position [1, 2] is 11, outside the vocabulary [0, 11)"));
  tokens.inputs[1 * 4 + 2] = 0;
  tokens.inputs[3] = -4;
  EXPECT_THAT(run_error(tokens).what(), HasSubstr("position [0, 3] is -4"));
}

TEST(Gpt, TargetOutsideTheVocabularyIsADataError) {
  Tokens tokens = make_tokens(2, 4, kTiny.vocab_size, 1);
  tokens.targets[5] = 11;
  const Error error = run_error(tokens);
  EXPECT_EQ(error.kind(), ErrorKind::kData);
  EXPECT_THAT(error.what(), HasSubstr("target of row 5 is 11"));
}

TEST(Gpt, BadBatchShapesAreUsageErrors) {
  Tokens too_long = make_tokens(2, 6, kTiny.vocab_size, 1);  // seq_len is 5
  Error error = run_error(too_long);
  EXPECT_EQ(error.kind(), ErrorKind::kUsage);
  EXPECT_THAT(error.what(), HasSubstr("embedding: inputs must be int32 [B, T]"));
  EXPECT_THAT(error.what(), HasSubstr("1 <= T <= seq_len (5), got int32 [2, 6]"));

  error = run_error(make_tokens(2, 4, kTiny.vocab_size, 1), [](Batch& batch) {
    batch.targets.shape = {4, 2};
  });
  EXPECT_EQ(error.kind(), ErrorKind::kUsage);
  EXPECT_THAT(error.what(), HasSubstr("head: targets must be int32 [2, 4] like the inputs"));

  error = run_error(make_tokens(2, 4, kTiny.vocab_size, 1),
                    [](Batch& batch) { batch.inputs.dtype = DType::kFloat32; });
  EXPECT_EQ(error.kind(), ErrorKind::kUsage);
  EXPECT_THAT(error.what(), HasSubstr("got fp32 [2, 4]"));
}

}  // namespace
}  // namespace zest
