// The shard layout of a unit: every element owned by exactly one rank, equal aligned shards,
// bounded padding, and the maps between flat elements, parameters and ranks agreeing. Checked on
// randomized units across world sizes and alignments, plus the errors for invalid units.
#include "memory/shard_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"

namespace zest {
namespace {

using ::testing::HasSubstr;

constexpr int kMaxWorld = 8;
constexpr std::size_t kAlignments[] = {1, 4, 32};

std::string describe(const std::vector<ParamShape>& params, int world, std::size_t alignment) {
  std::string text = "world " + std::to_string(world) + ", alignment " +
                     std::to_string(alignment) + ", params";
  for (const ParamShape& p : params) {
    text += " " + p.name + "[";
    for (std::size_t i = 0; i < p.shape.size(); ++i) {
      if (i) text += "x";
      text += std::to_string(p.shape[i]);
    }
    text += "]";
  }
  return text;
}

// Random units of 1..6 parameters with 1..3 dimensions of 1..50 each, plus fixed cases that hit
// the edges: single elements, sizes prime to every world size, one parameter spanning shards.
std::vector<std::vector<ParamShape>> test_units() {
  std::vector<std::vector<ParamShape>> units = {
      {{"scalar", {}}},
      {{"one", {1}}},
      {{"a", {1}}, {"b", {1}}, {"c", {1}}},
      {{"prime", {97}}},
      {{"w", {13, 17}}, {"b", {1}}, {"g", {53}}},
      {{"big", {50, 50, 7}}},
      {{"a", {31}}, {"b", {1}}, {"c", {37}}, {"d", {1}}, {"e", {41}}, {"f", {43}}},
  };
  std::mt19937 random(20240611);
  std::uniform_int_distribution<int> param_count(1, 6), rank(1, 3), dim(1, 50), pick(0, 9);
  for (int u = 0; u < 60; ++u) {
    std::vector<ParamShape> unit;
    const int params = param_count(random);
    for (int p = 0; p < params; ++p) {
      ParamShape shape{"p" + std::to_string(p), {}};
      const int dims = rank(random);
      for (int d = 0; d < dims; ++d) {
        // One dimension in ten is 1, so one-element parameters and thin ones turn up often.
        shape.shape.push_back(pick(random) == 0 ? 1 : dim(random));
      }
      unit.push_back(std::move(shape));
    }
    units.push_back(std::move(unit));
  }
  return units;
}

std::size_t numel_of(const ParamShape& p) {
  std::size_t n = 1;
  for (std::int64_t d : p.shape) n *= static_cast<std::size_t>(d);
  return n;
}

TEST(ShardLayout, ParametersAreLaidEndToEndInOrder) {
  for (const auto& unit : test_units()) {
    const ShardLayout layout = ShardLayout::build("unit", unit, 3, 4);
    ASSERT_EQ(layout.params().size(), unit.size());
    std::size_t offset = 0;
    for (std::size_t i = 0; i < unit.size(); ++i) {
      const ParamPlace& place = layout.params()[i];
      EXPECT_EQ(place.name, unit[i].name);
      EXPECT_EQ(place.shape, unit[i].shape);
      EXPECT_EQ(place.numel, numel_of(unit[i]));
      EXPECT_EQ(place.offset, offset) << "parameter " << i << " is not contiguous with the last";
      offset += place.numel;
    }
    EXPECT_EQ(layout.numel(), offset);
  }
}

TEST(ShardLayout, EveryElementOwnedByExactlyOneRank) {
  for (const auto& unit : test_units()) {
    for (int world = 1; world <= kMaxWorld; ++world) {
      for (std::size_t alignment : kAlignments) {
        SCOPED_TRACE(describe(unit, world, alignment));
        const ShardLayout layout = ShardLayout::build("unit", unit, world, alignment);
        // owners[p][i]: how many ranks' parts cover element i of parameter p.
        std::vector<std::vector<int>> covered(layout.params().size());
        for (std::size_t p = 0; p < covered.size(); ++p) {
          covered[p].assign(layout.params()[p].numel, 0);
        }
        for (int rank = 0; rank < world; ++rank) {
          for (const ParamInShard& part : layout.params_in_shard(rank)) {
            ASSERT_LT(part.param_index, covered.size());
            ASSERT_LE(part.param_elements.end, layout.params()[part.param_index].numel);
            ASSERT_LT(part.param_elements.begin, part.param_elements.end) << "empty part";
            for (std::size_t i = part.param_elements.begin; i < part.param_elements.end; ++i) {
              ++covered[part.param_index][i];
            }
          }
        }
        for (std::size_t p = 0; p < covered.size(); ++p) {
          for (std::size_t i = 0; i < covered[p].size(); ++i) {
            ASSERT_EQ(covered[p][i], 1) << "parameter " << p << " element " << i;
          }
        }
      }
    }
  }
}

TEST(ShardLayout, ShardsAreEqualAlignedAndPaddingIsBounded) {
  for (const auto& unit : test_units()) {
    for (int world = 1; world <= kMaxWorld; ++world) {
      for (std::size_t alignment : kAlignments) {
        SCOPED_TRACE(describe(unit, world, alignment));
        const ShardLayout layout = ShardLayout::build("unit", unit, world, alignment);
        const std::size_t quantum = static_cast<std::size_t>(world) * alignment;
        EXPECT_EQ(layout.world_size(), world);
        EXPECT_EQ(layout.alignment(), alignment);
        EXPECT_EQ(layout.flat_length() % quantum, 0u);
        EXPECT_GE(layout.flat_length(), layout.numel());
        EXPECT_EQ(layout.padding(), layout.flat_length() - layout.numel());
        EXPECT_LT(layout.padding(), quantum);
        EXPECT_EQ(layout.shard_length() * world, layout.flat_length());
        std::size_t expected_begin = 0;
        for (int rank = 0; rank < world; ++rank) {
          const ElementRange range = layout.shard_range(rank);
          EXPECT_EQ(range.begin, expected_begin) << "rank " << rank << ": shards not contiguous";
          EXPECT_EQ(range.size(), layout.shard_length()) << "rank " << rank;
          EXPECT_EQ(range.begin % alignment, 0u) << "rank " << rank;
          expected_begin = range.end;
        }
        EXPECT_EQ(expected_begin, layout.flat_length());
      }
    }
  }
}

TEST(ShardLayout, PiecesTileEachShardInFlatOrder) {
  for (const auto& unit : test_units()) {
    for (int world = 1; world <= kMaxWorld; ++world) {
      for (std::size_t alignment : kAlignments) {
        SCOPED_TRACE(describe(unit, world, alignment));
        const ShardLayout layout = ShardLayout::build("unit", unit, world, alignment);
        for (int rank = 0; rank < world; ++rank) {
          const ElementRange shard = layout.shard_range(rank);
          std::size_t next_shard_offset = 0;
          std::size_t last_param = 0;
          bool first = true;
          for (const ParamInShard& part : layout.params_in_shard(rank)) {
            const ParamPlace& place = layout.params()[part.param_index];
            const std::size_t flat = place.offset + part.param_elements.begin;
            // The part's place in the shard is its flat position minus the shard's start.
            EXPECT_EQ(flat, shard.begin + part.shard_offset);
            EXPECT_LE(part.shard_offset + part.param_elements.size(), layout.shard_length());
            // In flat order, back to back: parameters are contiguous, so are their parts.
            EXPECT_EQ(part.shard_offset, next_shard_offset) << "rank " << rank;
            if (!first) {
              EXPECT_EQ(part.param_index, last_param + 1);
            }
            next_shard_offset = part.shard_offset + part.param_elements.size();
            last_param = part.param_index;
            first = false;
          }
          // What the parts leave over at the end of the shard is padding, and only the last
          // shards hold padding.
          const std::size_t real_in_shard =
              shard.begin >= layout.numel()
                  ? 0
                  : std::min(shard.end, layout.numel()) - shard.begin;
          EXPECT_EQ(next_shard_offset, real_in_shard) << "rank " << rank;
        }
      }
    }
  }
}

TEST(ShardLayout, OwnerOfAgreesWithShardRangeAndPieces) {
  for (const auto& unit : test_units()) {
    for (int world = 1; world <= kMaxWorld; ++world) {
      for (std::size_t alignment : kAlignments) {
        SCOPED_TRACE(describe(unit, world, alignment));
        const ShardLayout layout = ShardLayout::build("unit", unit, world, alignment);
        // The flat element → rank map built from the parts.
        std::vector<int> owner_from_parts(layout.flat_length(), -1);
        for (int rank = 0; rank < world; ++rank) {
          for (const ParamInShard& part : layout.params_in_shard(rank)) {
            const std::size_t flat =
                layout.params()[part.param_index].offset + part.param_elements.begin;
            for (std::size_t i = 0; i < part.param_elements.size(); ++i) {
              owner_from_parts[flat + i] = rank;
            }
          }
        }
        for (std::size_t element = 0; element < layout.flat_length(); ++element) {
          const int owner = layout.owner_of(element);
          ASSERT_GE(owner, 0);
          ASSERT_LT(owner, world);
          const ElementRange range = layout.shard_range(owner);
          ASSERT_GE(element, range.begin);
          ASSERT_LT(element, range.end);
          if (element < layout.numel()) {
            ASSERT_EQ(owner_from_parts[element], owner) << "element " << element;
          } else {
            ASSERT_EQ(owner_from_parts[element], -1) << "padding element " << element;
          }
        }
      }
    }
  }
}

TEST(ShardLayout, SingleRankOwnsEverythingWithoutPaddingAtAlignmentOne) {
  const ShardLayout layout = ShardLayout::build("embed", {{"wte", {7, 3}}, {"b", {5}}}, 1, 1);
  EXPECT_EQ(layout.numel(), 26u);
  EXPECT_EQ(layout.flat_length(), 26u);
  EXPECT_EQ(layout.padding(), 0u);
  const auto parts = layout.params_in_shard(0);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].param_elements.size(), 21u);
  EXPECT_EQ(parts[1].shard_offset, 21u);
}

TEST(ShardLayout, KnownSplitAcrossFourRanks) {
  // 10 + 3 + 8 = 21 elements; world 4 × alignment 2 → flat 24, shards of 6.
  const ShardLayout layout =
      ShardLayout::build("block.0", {{"w", {2, 5}}, {"b", {3}}, {"g", {8}}}, 4, 2);
  EXPECT_EQ(layout.unit_name(), "block.0");
  EXPECT_EQ(layout.flat_length(), 24u);
  EXPECT_EQ(layout.shard_length(), 6u);
  EXPECT_EQ(layout.padding(), 3u);
  // rank 1 holds flat [6, 12): w[6..10) then b[0..2).
  const auto parts = layout.params_in_shard(1);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].param_index, 0u);
  EXPECT_EQ(parts[0].param_elements.begin, 6u);
  EXPECT_EQ(parts[0].param_elements.end, 10u);
  EXPECT_EQ(parts[0].shard_offset, 0u);
  EXPECT_EQ(parts[1].param_index, 1u);
  EXPECT_EQ(parts[1].param_elements.begin, 0u);
  EXPECT_EQ(parts[1].param_elements.end, 2u);
  EXPECT_EQ(parts[1].shard_offset, 4u);
  // rank 3 holds flat [18, 24): g[5..8) then three padding elements.
  const auto last = layout.params_in_shard(3);
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].param_index, 2u);
  EXPECT_EQ(last[0].param_elements.begin, 5u);
  EXPECT_EQ(last[0].param_elements.end, 8u);
}

TEST(ShardLayout, RanksBeyondTheDataHoldOnlyPadding) {
  // One element over eight ranks: rank 0 owns it, ranks 1..7 own only padding.
  const ShardLayout layout = ShardLayout::build("tiny", {{"bias", {1}}}, 8, 1);
  EXPECT_EQ(layout.flat_length(), 8u);
  EXPECT_EQ(layout.params_in_shard(0).size(), 1u);
  for (int rank = 1; rank < 8; ++rank) EXPECT_TRUE(layout.params_in_shard(rank).empty()) << rank;
}

TEST(ShardLayout, DefaultAlignmentIs32Elements) {
  const ShardLayout layout = ShardLayout::build("u", {{"w", {100}}}, 2);
  EXPECT_EQ(layout.alignment(), kDefaultShardAlignment);
  EXPECT_EQ(layout.flat_length(), 128u);
}

Error build_error(const std::string& unit, const std::vector<ParamShape>& params, int world,
                  std::size_t alignment = 1) {
  try {
    ShardLayout::build(unit, params, world, alignment);
  } catch (const Error& error) {
    return error;
  }
  ADD_FAILURE() << "expected build() to throw";
  return Error(ErrorKind::kInternal, "");
}

TEST(ShardLayout, EmptyUnitIsAnErrorNamingTheUnit) {
  const Error error = build_error("block.7", {}, 2);
  EXPECT_EQ(error.kind(), ErrorKind::kUsage);
  EXPECT_THAT(error.what(), HasSubstr("block.7"));
}

TEST(ShardLayout, ZeroDimensionIsAnErrorNamingUnitAndParameter) {
  const Error error = build_error("block.3", {{"attn.qkv", {16, 48}}, {"attn.bias", {0}}}, 2);
  EXPECT_EQ(error.kind(), ErrorKind::kUsage);
  EXPECT_THAT(error.what(), HasSubstr("block.3"));
  EXPECT_THAT(error.what(), HasSubstr("attn.bias"));
  EXPECT_THAT(error.what(), HasSubstr("[0]"));
}

TEST(ShardLayout, NegativeDimensionIsAnErrorNamingUnitAndParameter) {
  const Error error = build_error("head", {{"lm_head.weight", {64, -3}}}, 4);
  EXPECT_EQ(error.kind(), ErrorKind::kUsage);
  EXPECT_THAT(error.what(), HasSubstr("head"));
  EXPECT_THAT(error.what(), HasSubstr("lm_head.weight"));
  EXPECT_THAT(error.what(), HasSubstr("-3"));
}

TEST(ShardLayout, WorldSizeZeroIsAnErrorNamingTheUnit) {
  const Error zero = build_error("embedding", {{"wte", {8}}}, 0);
  EXPECT_EQ(zero.kind(), ErrorKind::kUsage);
  EXPECT_THAT(zero.what(), HasSubstr("embedding"));
  EXPECT_THAT(zero.what(), HasSubstr("world size"));
  const Error negative = build_error("embedding", {{"wte", {8}}}, -2);
  EXPECT_THAT(negative.what(), HasSubstr("-2"));
}

TEST(ShardLayout, ZeroAlignmentIsAnErrorNamingTheUnit) {
  const Error error = build_error("mlp", {{"fc", {8}}}, 2, 0);
  EXPECT_EQ(error.kind(), ErrorKind::kUsage);
  EXPECT_THAT(error.what(), HasSubstr("mlp"));
  EXPECT_THAT(error.what(), HasSubstr("alignment"));
}

// Sizes are computed in arithmetic that cannot wrap: a layout past 64 bits is an error, never a
// wrapped length (or, for world size × alignment wrapping to 0, a division by zero).
TEST(ShardLayout, SizesPast64BitsAreAnErrorNotAWrap) {
  const std::int64_t k2To32 = std::int64_t{1} << 32;
  EXPECT_THAT(build_error("u", {{"w", {k2To32, k2To32}}}, 1).what(),
              HasSubstr("parameter 'w' (shape [4294967296, 4294967296]) has more elements than "
                        "fit in 64 bits"));
  const std::int64_t k2To62 = std::int64_t{1} << 62;
  EXPECT_THAT(build_error("u", {{"a", {k2To62}}, {"b", {k2To62}}, {"c", {k2To62}},
                                {"d", {k2To62}}},
                          1, 1)
                  .what(),
              HasSubstr("exceeds 64 bits"));
  EXPECT_THAT(build_error("u", {{"w", {8}}}, 4, std::size_t{1} << 62).what(),
              HasSubstr("world size 4, alignment 4611686018427387904) exceeds 64 bits"));
  // 2^64 - 2 elements fit; padded to a multiple of 4 they do not.
  const std::int64_t largest = std::numeric_limits<std::int64_t>::max();
  EXPECT_THAT(build_error("u", {{"a", {largest}}, {"b", {largest}}}, 4, 1).what(),
              HasSubstr("exceeds 64 bits"));
}

TEST(ShardLayout, RankOutsideTheWorldIsAnError) {
  const ShardLayout layout = ShardLayout::build("u", {{"w", {10}}}, 2, 1);
  EXPECT_THROW(layout.shard_range(2), Error);
  EXPECT_THROW(layout.shard_range(-1), Error);
  EXPECT_THROW(layout.params_in_shard(2), Error);
}

}  // namespace
}  // namespace zest
