// Shared by the GPT's parity tests (gpt_parity_test.cc, tensor_parallel_gpt_test.cc,
// tests/pipeline/tensor_parallel_pipeline_test.cc): a global batch the loss can fall on, the
// optimizer they train with, and the comparison of two runs' parameters within the bound of fp32
// reduction order.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "models/gpt.h"
#include "optim/optimizer.h"

namespace zest::testing {

// The tokens of a step's global batch, [sequences, seq_len], and their next tokens, drawn from
// `seed`: a fixed rule (t -> 3t + 1 mod vocab, a quarter of them noise) so that the loss has
// something to fall on.
inline void make_gpt_batch(const GptConfig& config, std::uint32_t seed, std::int64_t sequences,
                           std::vector<std::int32_t>& inputs, std::vector<std::int32_t>& targets) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> token(0, config.vocab_size - 1);
  const auto count = static_cast<std::size_t>(sequences * config.seq_len);
  inputs.resize(count);
  targets.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    inputs[i] = token(rng);
    targets[i] = rng() % 4 == 0 ? token(rng) : (3 * inputs[i] + 1) % config.vocab_size;
  }
}

inline OptimizerOptions parity_adamw() {
  OptimizerOptions optimizer;
  optimizer.type = "AdamW";
  optimizer.lr = 3e-3f;
  optimizer.weight_decay = 0.1f;
  return optimizer;
}

// Runs differ only in the order fp32 sums are taken: ~1e-7 relative in each gradient. Adam divides
// each gradient by its own running RMS, so an element whose gradient hovers near 0 turns that noise
// into a visible update; over 10 steps the largest gap measured is 7e-7 absolute (an element of
// 3e-3), the loss 7e-8 relative. 1e-5 relative with a 2e-6 absolute floor (parameters start at 0
// or ~0.02, and move by up to lr = 3e-3 a step) keeps a ~3x margin; a lost or doubled gradient, or
// a shard or slice updated from the wrong elements, moves parameters by ~lr, 1000x more.
constexpr double kParityRelative = 1e-5;
constexpr double kParityAbsolute = 2e-6;

// Note: the key bias (c_attn.bias[C, 2C)) has an identically zero gradient, since adding a
// constant to every key adds q·b to all of a query's scores alike and softmax ignores it. Its
// fp32 gradient is rounding noise (~1e-12) that Adam normalizes into updates that differ
// between reduction orders, so equality means nothing for it; it must instead stay at its
// initial 0 to within that noise (measured |value| <= 3e-6 after 10 steps; bound 1e-4).
inline bool is_key_bias(const GptConfig& config, const std::string& name, std::size_t index) {
  const auto C = static_cast<std::size_t>(config.n_embd);
  return name.ends_with(".attn.c_attn.bias") && index >= C && index < 2 * C;
}
constexpr double kKeyBiasBound = 1e-4;

// Every whole parameter of `run` against `expected`'s within the bound, the key bias near 0 in
// both; stops at the first mismatch (one says enough).
inline void expect_same_parameters(const GptConfig& config,
                                   const std::map<std::string, std::vector<float>>& expected,
                                   const std::map<std::string, std::vector<float>>& run) {
  ASSERT_EQ(run.size(), expected.size());
  for (const auto& [name, values] : expected) {
    ASSERT_TRUE(run.count(name)) << name;
    const std::vector<float>& other = run.at(name);
    ASSERT_EQ(values.size(), other.size()) << name;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const std::string what = name + "[" + std::to_string(i) + "]";
      if (is_key_bias(config, name, i)) {
        EXPECT_LE(std::abs(values[i]), kKeyBiasBound) << what;
        EXPECT_LE(std::abs(other[i]), kKeyBiasBound) << what;
      } else {
        EXPECT_NEAR(other[i], values[i], kParityRelative * std::abs(values[i]) + kParityAbsolute)
            << what;
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// The number of elements of each whole parameter of the GPT, by "unit.parameter".
inline std::map<std::string, std::size_t> whole_sizes(const GptConfig& config) {
  std::map<std::string, std::size_t> sizes;
  Gpt whole(config);
  for (Unit* unit : whole.units()) {
    for (const ParamSpec& spec : unit->parameters()) {
      std::size_t n = 1;
      for (std::int64_t d : spec.shape) n *= static_cast<std::size_t>(d);
      sizes[unit->name() + "." + spec.name] = n;
    }
  }
  return sizes;
}

}  // namespace zest::testing
