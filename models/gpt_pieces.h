// GPT-2 with its tied token table cut into k units of vocabulary rows (model.vocab_pieces k > 1;
// docs/concepts.md ("Vocabulary pieces")): "embedding" (wte rows [0, r) and wpe), "wte_piece1" ..
// "wte_piece{k-1}" (the other rows, each adding its rows for the tokens in its range to the
// residual stream), the blocks, and "head", which borrows the pieces in turn (one gathered at a
// time at stage 3) for its logits and d(ln_f out). The head's product for d(wte) is deferred to
// each piece's own backward, which reads the head's saved ln_f(x) and d(logits): the head's saved
// buffer lives until the embedding's backward (UnitMemory::saved_freed_by). With
// config.logits_by_pieces the head keeps a log-sum-exp per row instead of the [N, V] logits and
// each piece's logits are scratch, made in the head's forward, its backward and the piece's
// backward (kernels/cross_entropy_pieces.h; the pieces then read their parameters in backward).
// Invariant: the same initial model, losses within fp32 rounding of the uncut model (not
// bit-identical: products on a slice of the vocabulary are blocked differently by BLAS).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/module.h"
#include "models/gpt.h"

namespace zest {

// Rows [begin, begin + rows) of wte: the vocabulary cut into `pieces` nearly equal runs.
struct VocabPiece {
  std::int64_t begin = 0;
  std::int64_t rows = 0;
};
std::vector<VocabPiece> vocab_pieces(std::int64_t vocab, int pieces);

// The units of a GPT with config.vocab_pieces > 1 (resolved), appended to `units`.
void add_pieced_units(const GptConfig& config, std::vector<std::unique_ptr<Unit>>& units);
// Their allocations for tokens [batch, seq] (Module::unit_memory).
std::vector<UnitMemory> pieced_unit_memory(const GptConfig& config, std::int64_t batch,
                                           std::int64_t seq);

}  // namespace zest
