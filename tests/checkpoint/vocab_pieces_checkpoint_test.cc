// Checkpoints of a GPT in vocabulary pieces (models/gpt_pieces.h): export writes the pieces' rows
// as one embedding.wte [V, C], import cuts such a file for any piece count, and a checkpoint
// loads only into a model of its own piece count (a kConfig error naming model.vocab_pieces).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "checkpoint/export.h"
#include "checkpoint/parameter_import.h"
#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/writer.h"
#include "engine/engine.h"
#include "models/gpt.h"
#include "runtime/world.h"

namespace zest {
namespace {

namespace fs = std::filesystem;

GptConfig small_gpt(int pieces) { return {2, 2, 16, 512, 8, pieces}; }

std::string scratch(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("zest_vocab_pieces_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

CheckpointOptions saving_to(const std::string& dir) {
  CheckpointOptions options;
  options.dir = dir;
  return options;
}

// Every parameter by name, with the pieces' wte rows concatenated as "embedding.wte".
using Parameters = std::map<std::string, std::vector<float>>;

Parameters whole_parameters(Trainer& trainer) {
  Parameters params;
  std::vector<float> wte;
  for (const std::string& name : trainer.parameter_names()) {
    std::vector<float> value = trainer.full_parameter(name);
    if (name == "embedding.wte" || name.rfind("wte_piece", 0) == 0) {
      wte.insert(wte.end(), value.begin(), value.end());
    } else {
      params[name] = std::move(value);
    }
  }
  params["embedding.wte"] = std::move(wte);
  return params;
}

// Runs `body` with a stage-3 SGD trainer of `config` on each of `world` ranks.
template <typename Body>
void with_trainer(const GptConfig& config, int world, Body body) {
  WorldOptions world_options;
  world_options.ranks = world;
  World(world_options).run([&](RankContext& context) {
    Gpt model(config);
    EngineOptions options;
    options.stage = 3;
    Engine engine(context, options);
    OptimizerOptions sgd;
    sgd.type = "SGD";
    sgd.lr = 0.1f;
    auto trainer = engine.shard(model, make_optimizer(sgd));
    body(context, *trainer);
  });
}

void train_two_steps(RankContext& context, Trainer& trainer) {
  std::mt19937 rng(5 + context.rank);
  std::uniform_int_distribution<std::int32_t> token(0, 511);
  std::vector<std::int32_t> inputs(16), targets(16);
  for (int step = 0; step < 2; ++step) {
    for (auto& id : inputs) id = token(rng);
    for (auto& id : targets) id = token(rng);
    trainer.forward_backward({Tensor{inputs.data(), {2, 8}, DType::kInt32},
                              Tensor{targets.data(), {2, 8}, DType::kInt32}});
    trainer.step();
  }
}

TEST(VocabPiecesCheckpoint, ExportJoinsThePiecesAndImportCutsThemForAnyCount) {
  const std::string dir = scratch("export");
  Parameters trained;
  with_trainer(small_gpt(3), 2, [&](RankContext& context, Trainer& trainer) {
    train_two_steps(context, trainer);
    save_checkpoint(context, trainer, saving_to(dir), nlohmann::json::object());
    Parameters params = whole_parameters(trainer);
    if (context.rank == 0) trained = std::move(params);
  });
  const std::string file = dir + "/model.safetensors";
  export_safetensors(dir, file, DType::kFloat32);
  const SafetensorsReader reader(file);
  ASSERT_NE(reader.find("embedding.wte"), nullptr);
  EXPECT_EQ(reader.find("embedding.wte")->shape, (std::vector<std::int64_t>{512, 16}));
  EXPECT_EQ(reader.find("wte_piece1.wte"), nullptr);
  EXPECT_EQ(reader.read_float32("embedding.wte"), trained.at("embedding.wte"));
  EXPECT_EQ(reader.tensors().size(), trained.size());

  for (int pieces : {1, 5}) {
    SCOPED_TRACE("pieces " + std::to_string(pieces));
    Parameters imported;
    with_trainer(small_gpt(pieces), 1, [&](RankContext& context, Trainer& trainer) {
      import_parameters(context, trainer, file);
      imported = whole_parameters(trainer);
    });
    EXPECT_EQ(imported, trained);  // bit for bit: a copy of fp32 values
  }
}

TEST(VocabPiecesCheckpoint, ACheckpointLoadsOnlyWithItsOwnPieceCount) {
  const std::string dir = scratch("load");
  with_trainer(small_gpt(3), 2, [&](RankContext& context, Trainer& trainer) {
    train_two_steps(context, trainer);
    save_checkpoint(context, trainer, saving_to(dir), nlohmann::json::object());
  });
  for (int pieces : {1, 4}) {
    with_trainer(small_gpt(pieces), 2, [&](RankContext& context, Trainer& trainer) {
      try {
        load_checkpoint(context, trainer, dir);
        ADD_FAILURE() << pieces << " pieces loaded a checkpoint of 3";
      } catch (const Error& error) {
        EXPECT_EQ(error.kind(), ErrorKind::kConfig);
        const std::string message = error.what();
        EXPECT_EQ(message.rfind("model.vocab_pieces: ", 0), 0u) << message;
        EXPECT_NE(message.find("saved with 3 vocab pieces, this model has " +
                               std::to_string(pieces)),
                  std::string::npos)
            << message;
      }
    });
  }
  with_trainer(small_gpt(3), 2, [&](RankContext& context, Trainer& trainer) {
    EXPECT_EQ(load_checkpoint(context, trainer, dir).step, 2);
  });
}

}  // namespace
}  // namespace zest
