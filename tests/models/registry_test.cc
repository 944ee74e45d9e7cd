// The registry's unit names, computed without declaring a model, are the names of the units the
// declared model has, and an invalid spec fails the same way in both.
#include "models/registry.h"

#include <functional>
#include <memory>
#include <string>
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
