// The GPT block's parameters and saved activations (models/gpt_block.h), laid out once for the
// whole block and its tensor-parallel slices, which declare the same parameters in the same order
// and keep the same activations, a slice's per-head and MLP ones a t-th of the whole block's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/attention.h"
#include "memory/tensor.h"

namespace zest::gpt_block_layout {

// Parameter indices, in declaration order.
enum Param : std::size_t {
  kLn1Weight, kLn1Bias, kAttnWeight, kAttnBias, kAttnProjWeight, kAttnProjBias,
  kLn2Weight, kLn2Bias, kFcWeight, kFcBias, kMlpProjWeight, kMlpProjBias,
};

// Where each saved activation lives in the block's activations buffer (offsets in floats):
// `channels` wide for the residual stream and the LayerNorms, `a.channels()` (the block's heads:
// all of them, or a tensor-parallel slice's) for the attention output and the MLP. The residual
// stream and the LayerNorms hold `stream_rows` rows (a sequence-parallel rank's share), the rest
// every row.
struct Saved {
  std::size_t ln1, mean1, rstd1, split, probs, y, x1, ln2, mean2, rstd2, h, g, total;

  explicit Saved(const AttentionShape& a) : Saved(a, a.channels(), a.batch * a.seq) {}
  Saved(const AttentionShape& a, std::int64_t channels, std::int64_t stream_rows) {
    const std::size_t n = static_cast<std::size_t>(a.batch * a.seq);
    const std::size_t ns = static_cast<std::size_t>(stream_rows);
    const std::size_t nc = ns * static_cast<std::size_t>(channels);
    const std::size_t ncl = n * static_cast<std::size_t>(a.channels());
    std::size_t at = 0;
    auto take = [&at](std::size_t count) { const std::size_t here = at; at += count; return here; };
    ln1 = take(nc); mean1 = take(ns); rstd1 = take(ns);
    split = take(a.split_elements()); probs = take(a.probs_elements());
    y = take(ncl); x1 = take(nc);
    ln2 = take(nc); mean2 = take(ns); rstd2 = take(ns);
    h = take(4 * ncl); g = take(4 * ncl);
    total = at;
  }
};

}  // namespace zest::gpt_block_layout
