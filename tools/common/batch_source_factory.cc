#include "tools/common/batch_source_factory.h"

#include <optional>
#include <string>
#include <utility>

#include "base/error.h"
#include "data/token_data.h"

namespace zest {

namespace {

std::shared_ptr<const TokenData> load(const std::string& type, const std::string& path,
                                      std::int64_t vocab_size, const std::string& key) {
  if (type == "text") return std::make_shared<const TokenData>(load_text_tokens(path, key));
  return std::make_shared<const TokenData>(load_token_shards(path, vocab_size, key));
}

}  // namespace

std::unique_ptr<BatchSource> make_batch_source(const TrainConfig& config) {
  const DataConfig& data = config.data;
  if (data.type == "synthetic") {
    return classification_batches({data.features, data.classes, config.engine.seed});
  }
  const std::int64_t seq_len = config.model.gpt.seq_len;
  const std::int64_t vocab = config.model.gpt.vocab_size;
  std::shared_ptr<const TokenData> tokens = load(data.type, data.path, vocab, "data.path");
  if (!data.val_path.empty()) {
    std::shared_ptr<const TokenData> held_out = load(data.type, data.val_path, vocab, "data.val_path");
    return sequence_batches(TokenBatches::training(tokens, seq_len, config.engine.seed, 0.0),
                            TokenBatches::validation(held_out, seq_len, 1.0));
  }
  std::optional<TokenBatches> validation;
  if (data.val_fraction > 0) {
    validation = TokenBatches::validation(tokens, seq_len, data.val_fraction);
  }
  return sequence_batches(
      TokenBatches::training(tokens, seq_len, config.engine.seed, data.val_fraction),
      std::move(validation));
}

}  // namespace zest
