#include "runtime/communicator.h"

#include <fmt/format.h>

namespace zest {

namespace {

const char* reduction_name(Reduction reduction) {
  switch (reduction) {
    case Reduction::kSum: return "sum";
    case Reduction::kMean: return "mean";
    case Reduction::kPreDividedMean: return "pre-divided mean";
  }
  return "?";
}

}  // namespace

std::string describe_collective(std::string_view op, std::uint64_t sequence, std::size_t count,
                                DType dtype, Reduction reduction, int root,
                                std::string_view label) {
  std::string text = fmt::format("{} #{}", op, sequence);
  if (op != "barrier") {
    text += fmt::format(" ({} x {}", count, dtype_name(dtype));
    if (op == "reduce_scatter" || op == "all_reduce") {
      text += std::string(", ") + reduction_name(reduction);
    }
    if (op == "broadcast") text += fmt::format(", root {}", root);
    text += ")";
  }
  if (!label.empty()) text += fmt::format(" '{}'", label);
  return text;
}

std::string describe_transfer(std::string_view op, std::uint64_t sequence, std::size_t count,
                              DType dtype, int rank, int peer, std::string_view label,
                              std::string_view waited) {
  return fmt::format("rank {} waited{}{} for rank {} to {} {} ({} #{}, {} x {})", rank,
                     waited.empty() ? "" : " ", waited, peer, op == "send" ? "receive" : "send",
                     label.empty() ? std::string("its data") : fmt::format("'{}'", label), op,
                     sequence, count, dtype_name(dtype));
}

std::string at_step(std::int64_t step) {
  return step > 0 ? " at step " + std::to_string(step) : std::string();
}

std::string seconds_text(std::chrono::milliseconds duration) {
  return fmt::format("{:g} s", static_cast<double>(duration.count()) / 1000.0);
}

}  // namespace zest
