// The registry's unit names, computed without declaring a model, are the names of the units the
// declared model has, and an invalid spec fails the same way in both.
#include "models/registry.h"

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"

namespace zest {
namespace {

std::vector<std::string> declared_names(const ModelSpec& spec) {
  std::vector<std::string> names;
  const std::unique_ptr<Module> model = make_model(spec);
  for (Unit* unit : model->units()) names.push_back(unit->name());
  return names;
}

// What the declared model's units allow, as the engine reads it (engine/zero_trainer.cc).
std::vector<std::pair<bool, bool>> declared_recomputable(const ModelSpec& spec) {
  std::vector<std::pair<bool, bool>> flags;
  const std::unique_ptr<Module> model = make_model(spec);
  for (Unit* unit : model->units()) {
    flags.emplace_back(!unit->gradients_replace_parameters(), unit->supports_selective_recompute());
  }
  return flags;
}

std::vector<std::pair<bool, bool>> registry_recomputable(const ModelSpec& spec) {
  std::vector<std::pair<bool, bool>> flags;
  for (const Recomputable& unit : recomputable_units(spec)) flags.emplace_back(unit.full, unit.selective);
  return flags;
}

// A small GPT cut into `pieces` vocabulary pieces (kAutoVocabPieces: "auto", which cuts a
// vocabulary of 512 at width 8 into several).
ModelSpec small_gpt(int layers, int pieces, bool logits_by_pieces, int vocab = 16) {
  ModelSpec spec;
  spec.type = "gpt";
  spec.gpt.n_layer = layers;
  spec.gpt.n_head = 2;
  spec.gpt.n_embd = 8;
  spec.gpt.vocab_size = vocab;
  spec.gpt.seq_len = 4;
  spec.gpt.vocab_pieces = pieces;
  spec.gpt.logits_by_pieces = logits_by_pieces;
  return spec;
}

std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    return error.what();
  }
  ADD_FAILURE() << "no Error";
  return "";
}

TEST(ModelRegistry, UnitNamesAreTheDeclaredModelsUnits) {
  for (const std::vector<std::int64_t>& sizes :
       {std::vector<std::int64_t>{4, 3}, std::vector<std::int64_t>{13, 31, 17, 7}}) {
    ModelSpec spec;
    spec.type = "mlp";
    spec.mlp.sizes = sizes;
    EXPECT_EQ(unit_names(spec), declared_names(spec));
  }
  for (int layers : {1, 3}) {
    ModelSpec spec;
    spec.type = "gpt";
    spec.gpt.n_layer = layers;
    spec.gpt.n_head = 2;
    spec.gpt.n_embd = 8;
    spec.gpt.vocab_size = 16;
    spec.gpt.seq_len = 4;
    EXPECT_EQ(unit_names(spec), declared_names(spec)) << layers << " layers";
  }
}

TEST(ModelRegistry, UnitNamesAndCountCountTheVocabularyPieces) {
  for (int pieces : {2, 3, kAutoVocabPieces}) {
    for (bool logits : {false, true}) {
      const ModelSpec spec = small_gpt(2, pieces, logits, 512);
      const std::vector<std::string> declared = declared_names(spec);
      EXPECT_EQ(unit_names(spec), declared) << pieces << " pieces, logits by pieces " << logits;
      EXPECT_EQ(unit_count(spec), declared.size()) << pieces << " pieces";
    }
  }
  const std::vector<std::string> expected = {"embedding", "wte_piece1", "wte_piece2",
                                             "block0",    "block1",     "head"};
  EXPECT_EQ(unit_names(small_gpt(2, 3, false)), expected);
  EXPECT_GT(unit_count(small_gpt(2, kAutoVocabPieces, false, 512)), 4u);  // "auto" cut it
}

TEST(ModelRegistry, RecomputableUnitsAreWhatTheDeclaredUnitsAllow) {
  std::vector<ModelSpec> specs = {small_gpt(1, 1, false), small_gpt(3, 1, false),
                                  small_gpt(2, 2, false), small_gpt(2, 3, true),
                                  small_gpt(2, kAutoVocabPieces, false, 512)};
  ModelSpec mlp;
  mlp.type = "mlp";
  mlp.mlp.sizes = {13, 31, 17, 7};
  specs.push_back(mlp);
  for (const ModelSpec& spec : specs) {
    EXPECT_EQ(registry_recomputable(spec), declared_recomputable(spec))
        << spec.type << " with " << declared_names(spec).size() << " units";
  }
}

TEST(ModelRegistry, AnInvalidSpecFailsAsDeclaringIt) {
  ModelSpec unknown;
  unknown.type = "rnn";
  EXPECT_EQ(error_of([&] { unit_names(unknown); }), error_of([&] { make_model(unknown); }));
  ModelSpec short_mlp;
  short_mlp.mlp.sizes = {4};
  EXPECT_EQ(error_of([&] { unit_names(short_mlp); }), error_of([&] { make_model(short_mlp); }));
  ModelSpec odd_gpt;
  odd_gpt.type = "gpt";
  odd_gpt.gpt.n_head = 3;
  odd_gpt.gpt.n_embd = 8;
  EXPECT_EQ(error_of([&] { unit_names(odd_gpt); }), error_of([&] { make_model(odd_gpt); }));
}

}  // namespace
}  // namespace zest
