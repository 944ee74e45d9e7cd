// model.vocab_pieces in the config: 1 by default, a count or "auto" resolved into the JSON that
// --print-config shows, and one-line errors naming the key for anything else.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "resolve/resolved_config.h"

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

std::string error_of_config(const json& config) {
  try {
    parse_resolved_config(config, {});
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    return error.what();
  }
  return "accepted";
}

std::string error_of(const json& pieces) { return error_of_config(gpt_config(pieces)); }

TEST(VocabPiecesConfig, DefaultsToOneAndResolvesAuto) {
  TrainConfig plain = parse_resolved_config(gpt_config(nullptr), {});
  EXPECT_EQ(plain.model.gpt.vocab_pieces, 1);
  EXPECT_FALSE(plain.json["model"].contains("vocab_pieces"));  // today's resolved config
  TrainConfig cut = parse_resolved_config(gpt_config("auto"), {});
  EXPECT_EQ(cut.model.gpt.vocab_pieces, kAutoVocabPieces);
  EXPECT_EQ(cut.json["model"]["vocab_pieces"], 3);  // 512 x 16 over a 3280-element block
  EXPECT_EQ(parse_resolved_config(gpt_config(7), {}).json["model"]["vocab_pieces"], 7);
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
  EXPECT_FALSE(parse_resolved_config(config, {}).model.gpt.logits_by_pieces);
  EXPECT_FALSE(parse_resolved_config(config, {}).json["model"].contains("logits_by_pieces"));
  config["model"]["logits_by_pieces"] = true;
  const TrainConfig parsed = parse_resolved_config(config, {});
  EXPECT_TRUE(parsed.model.gpt.logits_by_pieces);
  EXPECT_EQ(parsed.json["model"]["logits_by_pieces"], true);
  for (const json& bad : {json(1), json("yes")}) {
    config["model"]["logits_by_pieces"] = bad;
    try {
      parse_resolved_config(config, {});
      ADD_FAILURE() << bad.dump() << " accepted";
    } catch (const Error& error) {
      EXPECT_EQ(std::string(error.what()).rfind("model.logits_by_pieces", 0), 0u) << error.what();
    }
  }
  json uncut = gpt_config(nullptr);
  uncut["model"]["logits_by_pieces"] = true;
  try {
    parse_resolved_config(uncut, {});
    ADD_FAILURE() << "accepted without vocab_pieces";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    const std::string message = error.what();
    EXPECT_EQ(message.rfind("model.logits_by_pieces: needs model.vocab_pieces", 0), 0u) << message;
  }
}

// The cut model's units are embedding, wte_piece1.., the blocks and the head wherever the config
// names units: the recompute plan it prints (and a checkpoint's manifest keeps), debug.fault.unit.
TEST(VocabPiecesConfig, TheConfigNamesTheCutModelsUnits) {
  json config = gpt_config(3);
  config["activation_checkpointing"] = {{"policy", "full"}};
  const TrainConfig full = parse_resolved_config(config, {});
  EXPECT_EQ(full.json["activation_checkpointing"]["recomputed"],
            json({"embedding", "wte_piece1", "wte_piece2", "block0", "block1"}));
  config["activation_checkpointing"] = {{"policy", "full"}, {"units", {{"every", 2}}}};
  EXPECT_EQ(parse_resolved_config(config, {}).json["activation_checkpointing"]["recomputed"],
            json({"wte_piece1", "block0"}));
  config["activation_checkpointing"] = {{"policy", "selective"}};
  EXPECT_EQ(parse_resolved_config(config, {}).json["activation_checkpointing"]["recomputed"],
            json({"block0", "block1"}));
  json faulty = gpt_config(3);
  faulty["debug"] = {{"fault", {{"kind", "throw"}, {"unit", "wte_piece2"}}}};
  EXPECT_EQ(parse_resolved_config(faulty, {}).engine.fault.unit, "wte_piece2");
  faulty["debug"]["fault"]["unit"] = "wte_piece3";
  EXPECT_EQ(error_of_config(faulty).rfind("debug.fault.unit: must name a unit of the model", 0),
            0u);
}

// A vocabulary piece's backward reads the head's saved values, and the head is on another
// pipeline stage: with pipeline stages the config refuses pieces in one line naming the key,
// whatever the stages, schedule or partition (it crashed while naming the partition's units).
TEST(VocabPiecesConfig, PipelineStagesRefuseVocabularyPiecesInOneLine) {
  const std::vector<json> pipelines = {
      {{"stages", 2}},
      {{"stages", 4}},
      {{"stages", 2}, {"partition", {2, 3}}},
      {{"stages", 2}, {"partition", "uniform"}},
      {{"stages", 2}, {"schedule", "interleaved_1f1b"}},
      {{"stages", 4}, {"schedule", "zb_h1"}},
      {{"stages", 2}, {"schedule", "gpipe"}, {"partition", "memory"}}};
  for (const json& pieces : {json(2), json("auto")}) {
    for (const json& pipeline : pipelines) {
      json config = gpt_config(pieces);
      config["world"] = {{"ranks", 4}};
      config["train_batch_size"] = 8;
      config["pipeline"] = pipeline;
      const std::string message = error_of_config(config);
      EXPECT_EQ(message.rfind("model.vocab_pieces: must be 1 with pipeline.stages > 1", 0), 0u)
          << pipeline.dump() << ": " << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
  // One pipeline stage is no pipeline: pieces train as without the block.
  json config = gpt_config(2);
  config["pipeline"] = {{"stages", 1}};
  EXPECT_NO_THROW(parse_resolved_config(config, {}));
}

}  // namespace
}  // namespace zest
