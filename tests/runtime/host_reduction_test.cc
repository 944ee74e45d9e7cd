// The fp32 reduction across ranks (the local backend's reduce-scatter and all-reduce) against the
// arithmetic it must keep to the bit: per element, in rank order, in float, then the division.
#include "runtime/host_reduction.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace zest {
namespace {

// One element at a time, as every rank must compute it.
float reference(const std::vector<std::vector<float>>& ranks, std::size_t i, Reduction reduction) {
  const auto world = static_cast<float>(ranks.size());
  float sum = 0.0f;
  for (std::size_t s = 0; s < ranks.size(); ++s) {
    const float value = reduction == Reduction::kPreDividedMean ? ranks[s][i] / world : ranks[s][i];
    sum = s == 0 ? value : sum + value;
  }
  return reduction == Reduction::kMean ? sum / world : sum;
}

std::uint32_t bits(float value) {
  std::uint32_t word;
  std::memcpy(&word, &value, sizeof word);
  return word;
}

std::vector<std::vector<float>> random_ranks(int world, std::size_t count, unsigned seed) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<std::vector<float>> ranks(static_cast<std::size_t>(world), std::vector<float>(count));
  for (auto& rank : ranks) {
    for (float& value : rank) value = normal(generator);
  }
  return ranks;
}

TEST(HostReduction, Fp32EqualsTheElementByElementSumToTheBit) {
  // Lengths around the 1024-element block and the 16-element lanes, at offsets that are not
  // multiples of either, for 1 to 5 ranks and each reduction.
  for (int world : {1, 2, 3, 4, 5}) {
    const auto ranks = random_ranks(world, 5000, 17u + static_cast<unsigned>(world));
    std::vector<const void*> sources;
    for (const auto& rank : ranks) sources.push_back(rank.data());
    for (Reduction reduction : {Reduction::kSum, Reduction::kMean, Reduction::kPreDividedMean}) {
      for (std::size_t length : {0u, 1u, 15u, 16u, 17u, 1023u, 1024u, 1025u, 2071u, 3000u}) {
        for (std::size_t begin : {0u, 3u, 1029u}) {
          std::vector<float> first(5000, -1.0f), second(5000, -1.0f);
          reduce_elements(sources, {first.data(), second.data()}, begin, length, DType::kFloat32,
                          reduction);
          for (std::size_t i = 0; i < 5000; ++i) {
            const bool inside = i >= begin && i < begin + length;
            const float expected = inside ? reference(ranks, i, reduction) : -1.0f;
            ASSERT_EQ(bits(first[i]), bits(expected))
                << "world " << world << " length " << length << " begin " << begin << " at " << i;
            ASSERT_EQ(bits(second[i]), bits(expected));
          }
        }
      }
    }
  }
}

TEST(HostReduction, Fp32DestinationMayBeASource) {
  // The local all-reduce writes each rank's output in place of its input.
  for (std::size_t length : {100u, 1024u, 2500u}) {
    auto ranks = random_ranks(4, length, 5u);
    const auto original = ranks;
    std::vector<const void*> sources;
    std::vector<void*> destinations;
    for (auto& rank : ranks) {
      sources.push_back(rank.data());
      destinations.push_back(rank.data());
    }
    reduce_elements(sources, destinations, 0, length, DType::kFloat32, Reduction::kMean);
    for (std::size_t i = 0; i < length; ++i) {
      for (const auto& rank : ranks) {
        ASSERT_EQ(bits(rank[i]), bits(reference(original, i, Reduction::kMean))) << i;
      }
    }
  }
}

}  // namespace
}  // namespace zest
