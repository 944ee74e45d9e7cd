// The `model` and `data` blocks: which built-in model with its sizes, and where its batches come
// from. The two are checked together: the data must fit the model (features and classes for the
// MLP, token values below vocab_size for the GPT).
#include <string>
#include <vector>

#include "config/blocks.h"

namespace zest::config_blocks {

using namespace config_reading;

namespace {

void parse_mlp(json& model, TrainConfig& out) {
  Block block(model, "model", {"type", "sizes", "init_from"});
  json& sizes = block.require("sizes", "the layer widths, input first, e.g. [64, 256, 10]");
  if (!sizes.is_array() || sizes.size() < 2) {
    config_error("model.sizes", "must be an array of at least 2 widths (input, ..., classes), got " +
                                    describe(sizes));
  }
  out.model.mlp.sizes.clear();
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::string path = "model.sizes[" + std::to_string(i) + "]";
    out.model.mlp.sizes.push_back(read_integer_at_least(sizes[i], path, 1));
  }
  out.model.init_from = read_string(block.get_or("init_from", ""), "model.init_from");
}

int read_gpt_size(Block& block, const char* key, std::int64_t minimum, const std::string& what) {
  const std::int64_t value =
      read_integer_at_least(block.require(key, what), block.path(key), minimum);
  if (value > (1 << 30)) {
    config_error(block.path(key), "must be at most 2^30, got " + std::to_string(value));
  }
  return static_cast<int>(value);
}

// model.vocab_pieces: 1 (the default, the uncut model), a count up to the vocabulary, or "auto"
// (a piece about a block's size: models/gpt_pieces.h).
void read_vocab_pieces(Block& block, GptConfig& gpt) {
  const json& value = block.get_or("vocab_pieces", 1);
  if (value.is_string() && value.get<std::string>() == "auto") {
    gpt.vocab_pieces = kAutoVocabPieces;
    return;
  }
  if (!value.is_number_integer()) {
    config_error(block.path("vocab_pieces"),
                 "must be an integer >= 1 or \"auto\", got " + describe(value));
  }
  const std::int64_t pieces = read_integer_at_least(value, block.path("vocab_pieces"), 1);
  if (pieces > gpt.vocab_size) {
    config_error(block.path("vocab_pieces"),
                 "must be at most model.vocab_size (" + std::to_string(gpt.vocab_size) +
                     "), a row per piece, got " + std::to_string(pieces));
  }
  gpt.vocab_pieces = static_cast<int>(pieces);
}

void parse_gpt(json& model, const json& data, TrainConfig& out) {
  Block block(model, "model",
              {"type", "n_layer", "n_head", "n_embd", "vocab_size", "seq_len", "vocab_pieces",
               "logits_by_pieces", "init_from"});
  GptConfig& gpt = out.model.gpt;
  gpt.n_layer = read_gpt_size(block, "n_layer", 1, "the number of transformer blocks, e.g. 4");
  gpt.n_head = read_gpt_size(block, "n_head", 1, "the attention heads per block, e.g. 4");
  gpt.n_embd = read_gpt_size(block, "n_embd", 1, "the model width (divisible by n_head), e.g. 128");
  gpt.seq_len = read_gpt_size(block, "seq_len", 1, "the sequence length, e.g. 64");
  // Byte-level text needs 256 tokens; llm.c's shards hold GPT-2 tokens.
  const auto type = data.is_object() ? data.find("type") : data.end();
  const bool text = type != data.end() && type->is_string() && *type == "text";
  block.get_or("vocab_size", text ? 256 : 50257);
  gpt.vocab_size = read_gpt_size(block, "vocab_size", 2, "the vocabulary size");
  out.model.init_from = read_string(block.get_or("init_from", ""), "model.init_from");
  // Note: absent, the key stays absent from the resolved JSON, so the uncut model's printed
  // config and manifests are today's.
  const bool pieces_given = model.contains("vocab_pieces");
  if (pieces_given) read_vocab_pieces(block, gpt);
  // Absent, absent from the resolved JSON too (as vocab_pieces). Checkpoints do not depend on it:
  // the units are the same either way.
  if (model.contains("logits_by_pieces")) {
    gpt.logits_by_pieces =
        read_bool(block.get_or("logits_by_pieces", false), block.path("logits_by_pieces"));
  }
  validate(gpt);  // n_embd divisible by n_head, naming model.<key>
  // The resolved JSON (--print-config, a checkpoint's manifest) shows the resolved count.
  if (pieces_given) block.get_or("vocab_pieces", 1) = resolved_vocab_pieces(gpt);
}

}  // namespace

void parse_model(Block& root, TrainConfig& out) {
  json& model = root.require("model", "e.g. {\"type\": \"gpt\", \"n_layer\": 4, \"n_head\": 4, "
                                      "\"n_embd\": 128, \"seq_len\": 64}");
  if (!model.is_object()) config_error("model", "must be an object, got " + describe(model));
  const std::vector<std::string> types = {"mlp", "gpt"};
  auto type_it = model.find("type");
  if (type_it == model.end()) config_error("model.type", "missing; allowed: " + one_of(types));
  out.model.type = read_string(*type_it, "model.type");
  if (out.model.type == "mlp") return parse_mlp(model, out);
  if (out.model.type == "gpt") return parse_gpt(model, root.object_or_empty("data"), out);
  config_error("model.type", "must be " + one_of(types) + ", got \"" + out.model.type + "\"");
}

namespace {

void parse_synthetic(Block& block, TrainConfig& out) {
  if (out.model.type != "mlp") {
    config_error("data.type", "synthetic classification needs model.type mlp; a gpt reads "
                              "\"tokens\" or \"text\"");
  }
  const auto& sizes = out.model.mlp.sizes;
  const std::string input_path = "model.sizes[0]";
  const std::string output_path = "model.sizes[" + std::to_string(sizes.size() - 1) + "]";
  out.data.features = read_integer_at_least(block.get_or("features", sizes.front()),
                                            block.path("features"), 1);
  if (out.data.features != sizes.front()) {
    config_error(block.path("features"),
                 "must equal " + input_path + " (" + std::to_string(sizes.front()) +
                     "), the model's input width, got " + std::to_string(out.data.features));
  }
  out.data.classes = read_integer_at_least(block.get_or("classes", sizes.back()),
                                           block.path("classes"), 2);
  if (out.data.classes != sizes.back()) {
    config_error(block.path("classes"),
                 "must equal " + output_path + " (" + std::to_string(sizes.back()) +
                     "), the model's output width, got " + std::to_string(out.data.classes));
  }
}

void parse_sequences(Block& block, TrainConfig& out) {
  const std::string& type = out.data.type;
  if (out.model.type != "gpt") {
    config_error("data.type", "\"" + type + "\" holds token sequences, which need model.type gpt");
  }
  if (type == "text" && out.model.gpt.vocab_size < 256) {
    config_error("model.vocab_size", "must be at least 256 for data.type \"text\" (byte tokens), "
                                     "got " + std::to_string(out.model.gpt.vocab_size));
  }
  const std::string example = type == "text" ? "a text file, e.g. \"configs/corpus/stories.txt\""
                                             : "a .bin file or a glob, e.g. \"data/train_*.bin\"";
  out.data.path = read_string(block.require("path", example), block.path("path"));
  if (out.data.path.empty()) config_error(block.path("path"), "must not be empty; " + example);
  out.data.val_path = read_string(block.get_or("val_path", ""), block.path("val_path"));
  out.data.val_fraction =
      read_number(block.get_or("val_fraction", 0.0), block.path("val_fraction"));
  if (out.data.val_fraction < 0 || out.data.val_fraction >= 1) {
    config_error(block.path("val_fraction"),
                 "must be a number in [0, 1), got " + block.find("val_fraction")->dump());
  }
  if (!out.data.val_path.empty() && out.data.val_fraction > 0) {
    config_error(block.path("val_fraction"),
                 "must be 0 when data.val_path is set (held-out data comes from one of them)");
  }
}

}  // namespace

void parse_data(Block& root, TrainConfig& out) {
  Block block(root.object_or_empty("data"), "data",
              {"type", "features", "classes", "path", "val_path", "val_fraction", "val_batches"});
  const std::vector<std::string> types = {"synthetic", "tokens", "text"};
  const std::string fallback = out.model.type == "mlp" ? "synthetic" : "text";
  out.data.type = read_string(block.get_or("type", fallback), block.path("type"));
  if (out.data.type == "synthetic") {
    parse_synthetic(block, out);
  } else if (out.data.type == "tokens" || out.data.type == "text") {
    parse_sequences(block, out);
  } else {
    config_error(block.path("type"), "must be " + one_of(types) + ", got \"" + out.data.type + "\"");
  }
  out.data.val_batches =
      read_integer_at_least(block.get_or("val_batches", 4), block.path("val_batches"), 1);
}

}  // namespace zest::config_blocks
