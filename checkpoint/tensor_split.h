// How a tensor-parallel checkpoint's parameter is cut among the ranks of the group that saved it,
// and the arithmetic that reads it at another tensor-parallel size: every element goes through its
// place in the whole parameter (the tensor-parallel-1 model's), so a checkpoint saved at TP 2
// loads at TP 1 or 4, and exports as whole tensors.
//
// Every rank of a group holds a part of the same shape, rank r the r-th (Megatron's splits, and
// models/gpt_block.h's): the last dimension is the columns, a vector is one column.
//   rows:    row i of rank r's part is whole row (i / block) × stride + r × block + i % block;
//            stride = tensor_ranks × block (q, k and v: each rank's heads of each), or 0 for one
//            block (whole row r × rows + i). The whole parameter has tensor_ranks × rows rows.
//   columns: rank r holds whole columns [r × columns, (r + 1) × columns) of every row.
//   whole:   every rank holds the whole parameter, the same values.
// Invariant: for a model's ParamSpec::DrawSlice, split_of's rule places every element where the
// DrawSlice does (tests/checkpoint/tensor_split_test.cc holds that for every rank of the GPT).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/module.h"

namespace zest {

struct TensorSplit {
  enum class Axis { kWhole, kRows, kColumns };
  Axis axis = Axis::kWhole;
  std::int64_t block = 0;   // kRows: rows per block
  std::int64_t stride = 0;  // kRows: whole rows between blocks; 0: one block
  bool operator==(const TensorSplit&) const = default;
};

const char* axis_name(TensorSplit::Axis axis);

// The rule rank `rank` of `tensor_ranks` follows for a part of shape `shape` cut as `slice` (not
// a slice: kWhole). A kInternal Error naming `name` when the slice is not its rank's r-th part by
// one of the rules above (a model cut its parameters another way).
TensorSplit split_of(const ParamSpec::DrawSlice& slice, const std::vector<std::int64_t>& shape,
                     int rank, int tensor_ranks, const std::string& name);

// The whole parameter's shape.
std::vector<std::int64_t> whole_shape(const std::vector<std::int64_t>& shape,
                                      const TensorSplit& split, int tensor_ranks);

// One parameter of one layout: its part's shape and how the whole was cut among `tensor_ranks`.
struct SplitParameter {
  std::vector<std::int64_t> shape;
  TensorSplit split;
  int tensor_ranks = 1;

  std::int64_t columns() const { return shape.size() >= 2 ? shape.back() : 1; }
  std::int64_t rows() const;
  // Elements [first, first + count) of rank `rank`'s part as runs along whole rows:
  // visit(offset into the range, whole row, whole column, count).
  void for_each_whole_run(
      int rank, std::size_t first, std::size_t count,
      const std::function<void(std::size_t, std::int64_t, std::int64_t, std::size_t)>& visit) const;
  // Whole row `row`, columns [column, column + count), as runs of the parts that hold it:
  // visit(offset into the run, rank, element of its part, count). A whole parameter's is rank 0's.
  void for_each_part_run(
      std::int64_t row, std::int64_t column, std::size_t count,
      const std::function<void(std::size_t, int, std::size_t, std::size_t)>& visit) const;
};

}  // namespace zest
