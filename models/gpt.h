// GPT-2 as zest units: "embedding" (wte, wpe), "block0".."block{L-1}" (pre-LN transformer
// blocks: causal multi-head self-attention and a GELU MLP, each added to the residual stream)
// and "head" (ln_f, then logits = ln_f(x) · wteᵀ with the LM head TIED to the embedding's wte:
// the head borrows unit 0 and accumulates d(wte) into it). Inputs are batch().inputs int32
// tokens [B, T], targets int32 next tokens [B, T], T <= seq_len; the head writes the mean
// cross-entropy over all B·T positions. Invariant: a token outside [0, vocab_size) is a kData
// Error naming its position and value; a config that validate() refuses is a kConfig Error.
// With vocab_pieces k > 1 the units are those of models/gpt_pieces.h instead.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/module.h"

namespace zest {

struct GptConfig {
  int n_layer = 12;         // model.n_layer
  int n_head = 12;          // model.n_head
  int n_embd = 768;         // model.n_embd; divisible by n_head
  int vocab_size = 50257;   // model.vocab_size
  int seq_len = 1024;       // model.seq_len: the longest sequence (rows of wpe)
  // model.vocab_pieces: wte cut into this many units of vocabulary rows (models/gpt_pieces.h);
  // kAutoVocabPieces picks a piece about a block's size. 1 is the uncut model.
  int vocab_pieces = 1;
  // model.logits_by_pieces: with vocab_pieces > 1, the head keeps a log-sum-exp per row instead of
  // the [N, vocab] logits and computes a piece's logits as scratch in its forward, its backward and
  // the piece's backward (two more products of N x vocab x n_embd a step; models/gpt_pieces.h).
  bool logits_by_pieces = false;
};
inline constexpr int kAutoVocabPieces = 0;

// config.vocab_pieces with "auto" resolved: ⌈vocab · n_embd / a block's elements⌉, at most the
// vocabulary, at least 1.
int resolved_vocab_pieces(const GptConfig& config);

// Throws a kConfig Error naming "model.<key>" when `config` is not allowed.
void validate(const GptConfig& config);

// The tokens of batch().inputs, checked on the host: int32 [B, T] with B >= 1 and
// 1 <= T <= seq_len (kUsage naming `unit` otherwise).
const std::int32_t* checked_tokens(const std::string& unit, const Tensor& tokens,
                                   const GptConfig& config);

// A residual-stream tensor (`what`: input, grad_output): float32 [B, T, C] (kUsage otherwise).
void check_stream(const std::string& unit, const char* what, const Tensor& tensor,
                  std::int64_t B, std::int64_t T, std::int64_t C);

// The head's input, the last block's output: float32 [B, T, C] (kUsage otherwise).
void check_head_input(const std::string& unit, const Tensor& input, std::int64_t C);

// The language-model head's targets: int32 [B, T] like the inputs (kUsage naming `unit` otherwise).
const std::int32_t* checked_head_targets(const std::string& unit, const Batch& batch, std::int64_t B,
                                         std::int64_t T);

class Gpt final : public Module {
 public:
  explicit Gpt(GptConfig config);
  ~Gpt() override;

  std::vector<Unit*> units() override;
  // input_shape: tokens [B, T].
  std::vector<UnitMemory> unit_memory(const std::vector<std::int64_t>& input_shape) const override;
  const GptConfig& config() const { return config_; }
  // Every parameter once (the tied LM head adds none): 124439808 for GPT-2 small.
  std::int64_t parameter_count() const;
  // "Gpt 12L 12H 768C, vocab 50257, seq 1024: 124439808 parameters"
  std::string describe() const;

 private:
  GptConfig config_;
  std::vector<std::unique_ptr<Unit>> units_;
};

}  // namespace zest
