#include "checkpoint/tensor_split.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/error.h"

namespace zest {

const char* axis_name(TensorSplit::Axis axis) {
  switch (axis) {
    case TensorSplit::Axis::kRows:
      return "rows";
    case TensorSplit::Axis::kColumns:
      return "columns";
    case TensorSplit::Axis::kWhole:
      break;
  }
  return "whole";
}

TensorSplit split_of(const ParamSpec::DrawSlice& slice, const std::vector<std::int64_t>& shape,
                     int rank, int tensor_ranks, const std::string& name) {
  if (!slice.enabled() || tensor_ranks == 1) return {};
  const SplitParameter part{shape, {}, tensor_ranks};
  const std::int64_t columns = part.columns();
  const std::int64_t rows = part.rows();
  if (shape.size() <= 2 && slice.full_columns == columns && slice.column_first == 0 &&
      slice.row_block > 0 && rows % slice.row_block == 0 &&
      slice.row_first == rank * slice.row_block &&
      ((slice.row_stride == 0 && slice.row_block == rows) ||
       slice.row_stride == tensor_ranks * slice.row_block)) {
    return {TensorSplit::Axis::kRows, slice.row_block, slice.row_stride};
  }
  if (shape.size() == 2 && slice.full_columns == columns * tensor_ranks &&
      slice.column_first == rank * columns && slice.row_first == 0 && slice.row_stride == 0 &&
      slice.row_block == rows) {
    return {TensorSplit::Axis::kColumns, 0, 0};
  }
  throw Error(ErrorKind::kInternal,
              fmt::format("parameter '{}' of tensor rank {} of {} is not cut as that rank's part "
                          "of the whole (rows or columns, checkpoint/tensor_split.h); its "
                          "checkpoint could not be read at another tensor-parallel size",
                          name, rank, tensor_ranks));
}

std::vector<std::int64_t> whole_shape(const std::vector<std::int64_t>& shape,
                                      const TensorSplit& split, int tensor_ranks) {
  std::vector<std::int64_t> whole = shape;
  if (whole.empty()) return whole;
  if (split.axis == TensorSplit::Axis::kRows) whole.front() *= tensor_ranks;
  if (split.axis == TensorSplit::Axis::kColumns) whole.back() *= tensor_ranks;
  return whole;
}

std::int64_t SplitParameter::rows() const {
  std::int64_t numel = 1;
  for (std::int64_t d : shape) numel *= d;
  return numel / columns();
}

void SplitParameter::for_each_whole_run(
    int rank, std::size_t first, std::size_t count,
    const std::function<void(std::size_t, std::int64_t, std::int64_t, std::size_t)>& visit) const {
  const auto width = static_cast<std::size_t>(columns());
  std::size_t done = 0;
  while (done < count) {
    const std::size_t element = first + done;
    const auto row = static_cast<std::int64_t>(element / width);
    const auto column = static_cast<std::int64_t>(element % width);
    const std::size_t run = std::min(width - element % width, count - done);
    switch (split.axis) {
      case TensorSplit::Axis::kWhole:
        visit(done, row, column, run);
        break;
      case TensorSplit::Axis::kRows:
        visit(done, (row / split.block) * split.stride + rank * split.block + row % split.block,
              column, run);
        break;
      case TensorSplit::Axis::kColumns:
        visit(done, row, rank * columns() + column, run);
        break;
    }
    done += run;
  }
}

void SplitParameter::for_each_part_run(
    std::int64_t row, std::int64_t column, std::size_t count,
    const std::function<void(std::size_t, int, std::size_t, std::size_t)>& visit) const {
  const std::int64_t width = columns();
  auto element = [width](std::int64_t part_row, std::int64_t part_column) {
    return static_cast<std::size_t>(part_row * width + part_column);
  };
  switch (split.axis) {
    case TensorSplit::Axis::kWhole:
      visit(0, 0, element(row, column), count);
      return;
    case TensorSplit::Axis::kRows: {
      if (split.stride == 0) {
        visit(0, static_cast<int>(row / split.block), element(row % split.block, column), count);
        return;
      }
      const std::int64_t within = row % split.stride;
      const std::int64_t part_row = (row / split.stride) * split.block + within % split.block;
      visit(0, static_cast<int>(within / split.block), element(part_row, column), count);
      return;
    }
    case TensorSplit::Axis::kColumns: {
      std::size_t done = 0;
      while (done < count) {
        const std::int64_t whole_column = column + static_cast<std::int64_t>(done);
        const std::size_t run =
            std::min(static_cast<std::size_t>(width - whole_column % width), count - done);
        visit(done, static_cast<int>(whole_column / width), element(row, whole_column % width),
              run);
        done += run;
      }
      return;
    }
  }
}

}  // namespace zest
