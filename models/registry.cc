#include "models/registry.h"

#include "base/error.h"

namespace zest {

namespace {

[[noreturn]] void unknown_type(const ModelSpec& spec) {
  throw Error(ErrorKind::kConfig, "model.type: must be mlp or gpt, got \"" + spec.type + "\"");
}

}  // namespace

std::unique_ptr<Module> make_model(const ModelSpec& spec) {
  if (spec.type == "mlp") return std::make_unique<Mlp>(spec.mlp);
  if (spec.type == "gpt") return std::make_unique<Gpt>(spec.gpt);
  unknown_type(spec);
}

std::size_t unit_count(const ModelSpec& spec) {
  if (spec.type == "mlp") {
    validate(spec.mlp);
    return spec.mlp.sizes.size() - 1;
  }
  if (spec.type != "gpt") unknown_type(spec);
  validate(spec.gpt);
  // The embedding (vocabulary piece 0 when cut), the other pieces, the blocks, the head.
  return static_cast<std::size_t>(resolved_vocab_pieces(spec.gpt)) +
         static_cast<std::size_t>(spec.gpt.n_layer) + 1;
}

// Note: these are the names the units give themselves (models/mlp.cc, models/gpt*.cc);
// tests/models/registry_test.cc holds the two equal, vocabulary pieces included.
std::vector<std::string> unit_names(const ModelSpec& spec) {
  std::vector<std::string> names;
  names.reserve(unit_count(spec));
  if (spec.type == "mlp") {
    for (std::size_t i = 0; i + 1 < spec.mlp.sizes.size(); ++i) {
      names.push_back("layer" + std::to_string(i));
    }
    return names;
  }
  names.push_back("embedding");
  for (int piece = 1; piece < resolved_vocab_pieces(spec.gpt); ++piece) {
    names.push_back("wte_piece" + std::to_string(piece));
  }
  for (int layer = 0; layer < spec.gpt.n_layer; ++layer) {
    names.push_back("block" + std::to_string(layer));
  }
  names.push_back("head");
  return names;
}

std::vector<Recomputable> recomputable_units(const ModelSpec& spec) {
  // Only the uncut embedding's gradient replaces its parameters (models/gpt.cc); a vocabulary
  // piece, the first included, recomputes fully like any other unit (models/gpt_pieces.cc).
  const bool uncut_embedding = spec.type == "gpt" && resolved_vocab_pieces(spec.gpt) == 1;
  std::vector<Recomputable> units;
  for (const std::string& name : unit_names(spec)) {
    units.push_back({!(uncut_embedding && name == "embedding"), name.starts_with("block")});
  }
  return units;
}

std::vector<std::int64_t> micro_batch_shape(const ModelSpec& spec, std::int64_t micro_batch) {
  if (spec.type == "gpt") return {micro_batch, spec.gpt.seq_len};
  return {micro_batch, spec.mlp.sizes.empty() ? 0 : spec.mlp.sizes.front()};
}

std::size_t micro_batch_bytes(const ModelSpec& spec, std::int64_t micro_batch) {
  const std::vector<std::int64_t> shape = micro_batch_shape(spec, micro_batch);
  const auto elements = static_cast<std::size_t>(shape[0] * shape[1]);
  if (spec.type == "gpt") return 2 * elements * sizeof(std::int32_t);
  return elements * sizeof(float) + static_cast<std::size_t>(micro_batch) * sizeof(std::int32_t);
}

std::size_t count_parameters(Module& module) {
  std::size_t count = 0;
  for (Unit* unit : module.units()) {
    for (const ParamSpec& spec : unit->parameters()) {
      std::size_t numel = 1;
      for (std::int64_t d : spec.shape) numel *= static_cast<std::size_t>(d);
      count += numel;
    }
  }
  return count;
}

}  // namespace zest
