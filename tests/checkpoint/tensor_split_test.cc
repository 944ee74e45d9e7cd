// The rule a tensor-parallel checkpoint records for each parameter (checkpoint/tensor_split.h)
// places every element of every rank's part where the model's own DrawSlice does — for every
// parameter of the tensor-parallel GPT, every rank, at sizes 2 and 4 — its whole shape is the
// tensor-parallel-1 GPT's, and reading a whole row back finds each element's rank and place.
// A slice cut another way is refused by name. The manifest keeps the rule (and reads a wrong one
// as one error naming its key).
#include <cstdint>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "checkpoint/manifest.h"
#include "checkpoint/tensor_split.h"
#include "models/gpt.h"
#include "models/tensor_parallel_gpt.h"
#include "runtime/shape_communicator.h"
#include "tests/support/capture_error.h"
#include "tests/support/tensor_slices.h"

namespace zest {
namespace {

using testing::drawn_at;
using ::testing::HasSubstr;

// 4 heads, a vocabulary of 36, 16 channels: each divides by 2 and 4.
const GptConfig kConfig{/*n_layer=*/1, /*n_head=*/4, /*n_embd=*/16, /*vocab_size=*/36,
                        /*seq_len=*/8};

std::int64_t numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

TEST(TensorSplit, EveryElementOfEveryRanksPartIsWhereTheModelDrewIt) {
  Gpt whole_model(kConfig);
  for (int size : {2, 4}) {
    for (int rank = 0; rank < size; ++rank) {
      // Only the parameters are asked for: a group that moves no values will do.
      shape::ShapeCommunicator group(rank, size);
      TensorParallelGpt model(kConfig, TensorSlice{rank, size, &group, false});
      const std::vector<Unit*> units = model.units();
      const std::vector<Unit*> whole_units = whole_model.units();
      ASSERT_EQ(units.size(), whole_units.size());
      for (std::size_t u = 0; u < units.size(); ++u) {
        const std::vector<ParamSpec> specs = units[u]->parameters();
        const std::vector<ParamSpec> whole_specs = whole_units[u]->parameters();
        ASSERT_EQ(specs.size(), whole_specs.size());
        for (std::size_t p = 0; p < specs.size(); ++p) {
          const ParamSpec& spec = specs[p];
          const std::string what = units[u]->name() + "." + spec.name + " at rank " +
                                   std::to_string(rank) + " of " + std::to_string(size);
          const TensorSplit split = split_of(spec.draw_slice, spec.shape, rank, size, what);
          EXPECT_EQ(whole_shape(spec.shape, split, size), whole_specs[p].shape) << what;
          EXPECT_EQ(split.axis == TensorSplit::Axis::kWhole, !spec.draw_slice.enabled()) << what;
          const SplitParameter part{spec.shape, split, size};
          const std::int64_t whole_columns =
              whole_specs[p].shape.size() >= 2 ? whole_specs[p].shape.back() : 1;
          part.for_each_whole_run(
              rank, 0, static_cast<std::size_t>(numel(spec.shape)),
              [&](std::size_t offset, std::int64_t row, std::int64_t column, std::size_t count) {
                for (std::size_t i = 0; i < count; ++i) {
                  const std::size_t element = offset + i;
                  const auto expected = static_cast<std::int64_t>(drawn_at(spec, element));
                  ASSERT_EQ(row * whole_columns + column + static_cast<std::int64_t>(i), expected)
                      << what << ", element " << element;
                }
                // And back: the run is this rank's, at the same elements.
                std::size_t found = 0;
                part.for_each_part_run(
                    row, column, count,
                    [&](std::size_t within, int owner, std::size_t element, std::size_t run) {
                      EXPECT_EQ(within, found) << what;
                      if (split.axis != TensorSplit::Axis::kWhole) {
                        EXPECT_EQ(owner, rank) << what;
                      }
                      EXPECT_EQ(element, offset + within) << what;
                      found += run;
                    });
                EXPECT_EQ(found, count) << what;
              });
        }
      }
    }
  }
}

TEST(TensorSplit, AWholeRowOfAColumnCutIsReadFromEveryRankInTurn) {
  // [2, 3] parts of a [2, 6] whole at size 2: row 1 is rank 0's elements 3-5, then rank 1's.
  const SplitParameter part{{2, 3}, {TensorSplit::Axis::kColumns, 0, 0}, 2};
  std::vector<std::vector<std::size_t>> runs;
  part.for_each_part_run(1, 1, 4,
                         [&](std::size_t within, int rank, std::size_t element, std::size_t count) {
                           runs.push_back({within, static_cast<std::size_t>(rank), element, count});
                         });
  const std::vector<std::vector<std::size_t>> expected = {{0, 0, 4, 2}, {2, 1, 3, 2}};
  EXPECT_EQ(runs, expected);
}

TEST(TensorSplit, ASliceThatIsNotItsRanksPartIsRefusedByName) {
  // Rank 1 of 2 holding rows [0, 4) of 8: not its part (that would be [4, 8)).
  const ParamSpec::DrawSlice wrong{/*full_columns=*/3, /*column_first=*/0, /*row_block=*/4,
                                   /*row_stride=*/0, /*row_first=*/0};
  const std::string message = testing::error_message(
      [&] { split_of(wrong, {4, 3}, 1, 2, "block0.mlp.c_fc.weight"); }, ErrorKind::kInternal);
  EXPECT_THAT(message, HasSubstr("'block0.mlp.c_fc.weight' of tensor rank 1 of 2"));
}

// A checkpoint of one unit, saved by 2 tensor ranks on 1 data-parallel rank: w cut by rows, b
// whole.
CheckpointManifest tensor_parallel_manifest() {
  CheckpointManifest m;
  m.tensor_parallel_size = 2;
  m.shard_alignment = 1;
  m.tensors = {{"params", DType::kFloat32}};
  m.units = describe_units({ShardLayout::build("unit", {{"w", {4, 3}}, {"b", {3}}}, 1, 1)});
  m.units[0].params[0].split = {TensorSplit::Axis::kRows, 2, 4};
  for (int file = 0; file < 2; ++file) m.files.push_back({rank_file_name(file), 60, 0});
  return m;
}

std::string parse_error(const nlohmann::json& manifest) {
  return testing::error_message(
      [&] { parse_manifest(manifest.dump(), "manifest.json", ManifestChecksum::kIgnore); },
      ErrorKind::kCheckpoint);
}

TEST(TensorSplit, TheManifestKeepsTheRuleAndNamesAWrongOne) {
  const CheckpointManifest read = parse_manifest(manifest_text(tensor_parallel_manifest()), "m");
  EXPECT_EQ(read.tensor_parallel_size, 2);
  EXPECT_EQ(read.units[0].params[0].split, (TensorSplit{TensorSplit::Axis::kRows, 2, 4}));
  EXPECT_EQ(read.units[0].params[1].split, TensorSplit{});
  EXPECT_EQ(read.file_of(0, 0, 1), 1);

  const nlohmann::json good = manifest_to_json(tensor_parallel_manifest());
  nlohmann::json bad = good;
  bad["units"][0]["params"][0]["tensor_split"]["axis"] = "diagonal";
  EXPECT_THAT(parse_error(bad), HasSubstr("units[0].params[0].tensor_split.axis"));
  bad = good;
  bad["units"][0]["params"][0]["tensor_split"]["stride"] = 3;
  EXPECT_THAT(parse_error(bad), HasSubstr("cuts 4 rows in blocks of 2 at a stride of 3"));
  bad = good;
  bad["units"][0]["params"][1]["tensor_split"] = {{"axis", "columns"}};
  EXPECT_THAT(parse_error(bad), HasSubstr("'columns' for a parameter not 2-D"));
  bad = good;
  bad.erase("tensor_parallel_size");
  bad["files"].erase(1);
  EXPECT_THAT(parse_error(bad), HasSubstr("a parameter is cut only among tensor-parallel ranks"));
  bad = good;
  bad["files"].erase(1);
  EXPECT_THAT(parse_error(bad), HasSubstr("lists 1 files for world_size 1 × pipeline_stages 1 × "
                                          "tensor_parallel_size 2"));
}

}  // namespace
}  // namespace zest
