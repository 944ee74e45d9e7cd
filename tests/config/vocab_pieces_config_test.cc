// model.vocab_pieces in the config: 1 by default, a count or "auto" resolved into the JSON that
// --print-config shows, and one-line errors naming the key for anything else.
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "config/train_config.h"

namespace zest {
namespace {

using nlohmann::json;

json gpt_config(const json& pieces) {
  json config = json::parse(R"({
    "model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 16, "seq_len": 8,
              "vocab_size": 512},
    "data": {"type": "text", "path": "corpus.txt"},
    "steps": 1,
    "train_batch_size": 2
  })");
  if (!pieces.is_null()) config["model"]["vocab_pieces"] = pieces;
  return config;
}

std::string error_of(const json& pieces) {
  try {
    parse_train_config(gpt_config(pieces), {});
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    return error.what();
  }
  return "accepted";
}

TEST(VocabPiecesConfig, DefaultsToOneAndResolvesAuto) {
  TrainConfig plain = parse_train_config(gpt_config(nullptr), {});
  EXPECT_EQ(plain.model.gpt.vocab_pieces, 1);
  EXPECT_FALSE(plain.json["model"].contains("vocab_pieces"));  // today's resolved config
  TrainConfig cut = parse_train_config(gpt_config("auto"), {});
  EXPECT_EQ(cut.model.gpt.vocab_pieces, kAutoVocabPieces);
  EXPECT_EQ(cut.json["model"]["vocab_pieces"], 3);  // 512 x 16 over a 3280-element block
  EXPECT_EQ(parse_train_config(gpt_config(7), {}).json["model"]["vocab_pieces"], 7);
}

TEST(VocabPiecesConfig, OutOfRangeOrNotAutoIsAOneLineErrorNamingTheKey) {
  for (const json& bad : {json(0), json(-2), json(513), json("half"), json(2.5), json(true)}) {
    const std::string message = error_of(bad);
    EXPECT_EQ(message.rfind("model.vocab_pieces", 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_NE(error_of(513).find("at most model.vocab_size (512)"), std::string::npos);
}

// model.logits_by_pieces: a boolean beside vocab_pieces, absent from the resolved JSON unless
// given, refused without vocabulary pieces.
TEST(VocabPiecesConfig, LogitsByPiecesIsABooleanThatNeedsVocabularyPieces) {
  json config = gpt_config("auto");
  EXPECT_FALSE(parse_train_config(config, {}).model.gpt.logits_by_pieces);
  EXPECT_FALSE(parse_train_config(config, {}).json["model"].contains("logits_by_pieces"));
  config["model"]["logits_by_pieces"] = true;
  const TrainConfig parsed = parse_train_config(config, {});
  EXPECT_TRUE(parsed.model.gpt.logits_by_pieces);
  EXPECT_EQ(parsed.json["model"]["logits_by_pieces"], true);
  for (const json& bad : {json(1), json("yes")}) {
    config["model"]["logits_by_pieces"] = bad;
    try {
      parse_train_config(config, {});
      ADD_FAILURE() << bad.dump() << " accepted";
    } catch (const Error& error) {
      EXPECT_EQ(std::string(error.what()).rfind("model.logits_by_pieces", 0), 0u) << error.what();
    }
  }
  json uncut = gpt_config(nullptr);
  uncut["model"]["logits_by_pieces"] = true;
  try {
    parse_train_config(uncut, {});
    ADD_FAILURE() << "accepted without vocab_pieces";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    const std::string message = error.what();
    EXPECT_EQ(message.rfind("model.logits_by_pieces: needs model.vocab_pieces", 0), 0u) << message;
  }
}

}  // namespace
}  // namespace zest
