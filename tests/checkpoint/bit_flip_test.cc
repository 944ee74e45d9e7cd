// Nothing in a checkpoint changes silently: a sweep flips, one at a time, every bit of a small
// checkpoint's manifest.json and `latest` and a sample of each rank file's bits, and each flip
// must be found by verify_checkpoint (what zest-ckpt verify runs) and by load_checkpoint (what a
// resume runs) with one clear error naming the file — or, for `latest` alone, turn the name of
// the newest step into that of another complete one, which then loads whole (its own state,
// counters and data position). Then `latest`'s strict form, a renamed parameter, and manifests
// written before manifests carried a checksum.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "checkpoint/manifest.h"
#include "tests/checkpoint/checkpoint_test_support.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDirectory;
using testing::TrainSpec;

namespace fs = std::filesystem;

// A small MLP (two units of 36 and 21 parameters, each padded to 64 for two ranks, so that both
// rank files hold parameters and a load at world size 1 reads and verifies both): rank files of
// 768 bytes, a manifest of about 2 kB.
const std::vector<std::int64_t> kSizes = {5, 6, 3};

// What one call did: nothing thrown, or the Error's kind and message.
struct Outcome {
  bool threw = false;
  ErrorKind kind = ErrorKind::kInternal;
  std::string message;
  LoadedCheckpoint loaded;  // when load did not throw
};

Outcome outcome_of(const std::function<LoadedCheckpoint()>& run) {
  Outcome outcome;
  try {
    outcome.loaded = run();
  } catch (const Error& error) {
    outcome.threw = true;
    outcome.kind = error.kind();
    outcome.message = error.what();
  }
  return outcome;
}

// One clear error: a checkpoint error, one line, no byte a terminal would act on, naming `file`.
void expect_clear(const Outcome& outcome, const std::string& file, const std::string& what) {
  EXPECT_EQ(outcome.kind, ErrorKind::kCheckpoint) << what << ": " << outcome.message;
  EXPECT_THAT(outcome.message, HasSubstr(file)) << what;
  const bool plain = std::none_of(outcome.message.begin(), outcome.message.end(), [](char c) {
    return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
  });
  EXPECT_TRUE(plain) << what << ": " << outcome.message;
}

// Why a flip was refused, by the message's words.
std::string reason(const std::string& message) {
  for (const char* why : {"checksum mismatch", "not valid JSON",
                          "declares a checksum but does not end with its line",
                          "not the name of a step directory", "which does not exist"}) {
    if (message.find(why) != std::string::npos) return why;
  }
  return "unexplained";
}

// A one-rank trainer of kSizes that stays up for many loads (a failed load leaves its state
// undefined, but every successful one below overwrites all of it).
class Loader {
 public:
  explicit Loader(const std::function<void(RankContext&, Trainer&)>& body) {
    WorldOptions options;
    options.ranks = 1;
    options.backend = "local";
    World world(options);
    world.run([&](RankContext& context) {
      Mlp model(MlpConfig{kSizes});
      Engine engine(context, EngineOptions{});
      OptimizerOptions optimizer;
      optimizer.type = "AdamW";
      auto trainer = engine.shard(model, make_optimizer(optimizer));
      body(context, *trainer);
    });
  }
};

std::map<std::string, std::vector<float>> parameters(Trainer& trainer) {
  std::map<std::string, std::vector<float>> values;
  for (const std::string& name : trainer.parameter_names()) {
    values[name] = trainer.full_parameter(name);
  }
  return values;
}

class CheckpointBitFlips : public ::testing::Test {
 protected:
  // Steps 1, 2 and 3 saved by two ranks at stage 1; `latest` names step-3.
  void SetUp() override {
    TrainSpec spec;
    spec.world = 2;
    spec.stage = 1;
    spec.sizes = kSizes;
    spec.global_batch = 8;
    spec.steps = 3;
    spec.save_dir = root();
    spec.save_every = 1;
    testing::train_mlp(spec);
    ASSERT_EQ(testing::read_whole_file(root() + "/latest"), "step-3\n");
  }
  std::string root() const { return scratch_.path("ckpt"); }
  std::string step_dir(int step = 3) const { return root() + "/step-" + std::to_string(step); }

  ScratchDirectory scratch_;
};

// Flips one bit of a file in place, and back when destroyed. Note: in place, not by rewriting
// the file: ext4 flushes a file truncated and rewritten at close, some milliseconds a flip.
class BitFlip {
 public:
  BitFlip(std::string path, std::size_t bit) : path_(std::move(path)), bit_(bit) { flip(); }
  ~BitFlip() { flip(); }
  BitFlip(const BitFlip&) = delete;
  BitFlip& operator=(const BitFlip&) = delete;

 private:
  void flip() {
    std::fstream file(path_, std::ios::in | std::ios::out | std::ios::binary);
    char byte = 0;
    file.seekg(static_cast<std::streamoff>(bit_ / 8));
    file.get(byte);
    file.seekp(static_cast<std::streamoff>(bit_ / 8));
    file.put(static_cast<char>(byte ^ (1 << (bit_ % 8))));
    ASSERT_TRUE(file.good()) << path_;
  }
  std::string path_;
  std::size_t bit_;
};

// Note: each flip loads a checkpoint; under ASan every bit of the manifest took the test past
// its 120 s limit, and with every 7th bit of it and every 5th of the rank files it took 118 s on
// a loaded machine, so sanitizer builds flip every 7th bit of the manifest and every 13th of the
// rank files (every bit position still, across bytes: 7 and 13 are coprime with 8) and leave the
// denser flips to the default build.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ZEST_BIT_FLIPS_SAMPLED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(ZEST_BIT_FLIPS_SAMPLED)
constexpr std::size_t kManifestStride = 7;
constexpr std::size_t kRankFileStride = 13;
#else
constexpr std::size_t kManifestStride = 1;
constexpr std::size_t kRankFileStride = 5;
#endif

TEST_F(CheckpointBitFlips, EveryFlipIsFoundOrLoadsAnotherWholeCheckpoint) {
  struct Target {
    std::string path;
    std::string file;    // what the error must name
    std::size_t stride;  // every stride-th bit is flipped
  };
  // Rank files: every 5th bit (13th under a sanitizer), so every byte and, across bytes, every
  // bit position (5 and 13 are coprime with 8); 2 × 1229 flips at 5.
  const std::vector<Target> targets = {{step_dir() + "/manifest.json", "manifest.json", kManifestStride},
                                       {root() + "/latest", "latest", 1},
                                       {step_dir() + "/rank-0.bin", "rank-0.bin", kRankFileStride},
                                       {step_dir() + "/rank-1.bin", "rank-1.bin", kRankFileStride}};
  std::map<std::string, int> counts;  // outcome -> flips
  // Flips before the checksum line must all be mismatches; in it, the line no longer reads as one.
  const std::size_t checksum_line_at =
      testing::read_whole_file(step_dir() + "/manifest.json").rfind("  \"manifest_xxh3\"");
  Loader([&](RankContext& context, Trainer& trainer) {
    // Each step's state loaded by its own path: what a flip to its name must reproduce.
    std::map<std::string, std::map<std::string, std::vector<float>>> saved;
    for (int step : {1, 2, 3}) {
      load_checkpoint(context, trainer, step_dir(step));
      saved[step_dir(step)] = parameters(trainer);
    }
    for (const Target& target : targets) {
      const std::size_t bits = fs::file_size(target.path) * 8;
      for (std::size_t bit = 0; bit < bits; bit += target.stride) {
        const std::string what = target.file + " bit " + std::to_string(bit);
        const BitFlip flip(target.path, bit);
        const Outcome verify = outcome_of([&] {
          verify_checkpoint(root());
          return LoadedCheckpoint{};
        });
        const Outcome load = outcome_of([&] { return load_checkpoint(context, trainer, root()); });
        if (verify.threw && load.threw) {
          expect_clear(verify, target.file, what + " (verify)");
          expect_clear(load, target.file, what + " (load)");
          const std::string why = reason(verify.message);
          EXPECT_THAT(load.message, HasSubstr(why)) << what;
          if (target.file == "manifest.json" && bit / 8 < checksum_line_at) {
            EXPECT_EQ(why, "checksum mismatch") << what << ": " << verify.message;
          }
          ++counts[target.file + ": found, " + why];
        } else if (verify.threw || load.threw) {
          const std::string by = verify.threw ? "verify" : "load";
          if (++counts[target.file + ": found by " + by + " only"] <= 5) {
            ADD_FAILURE() << what << " found by " << by << " only";
          }
        } else if (target.file == "latest" && load.loaded.path != step_dir() &&
                   saved.contains(load.loaded.path)) {
          // `latest` now names another step: its checkpoint must load whole.
          EXPECT_EQ(step_dir(static_cast<int>(load.loaded.step)), load.loaded.path) << what;
          EXPECT_EQ(trainer.steps_taken(), load.loaded.step) << what;
          EXPECT_EQ(parameters(trainer), saved.at(load.loaded.path)) << what;
          ++counts["latest: names " + fs::path(load.loaded.path).filename().string() +
                   ", which loads whole"];
        } else {
          if (++counts[target.file + ": unnoticed"] <= 5) {
            ADD_FAILURE() << what << " passed verify and load unnoticed";
          }
        }
      }
    }
  });
  std::map<std::string, int> found;  // file -> flips found
  for (const auto& [outcome, flips] : counts) {
    std::cout << flips << " flips, " << outcome << "\n";
    EXPECT_EQ(outcome.find("unexplained"), std::string::npos) << outcome;
    if (outcome.find(": found, ") != std::string::npos) {
      found[outcome.substr(0, outcome.find(':'))] += flips;
    }
  }
  const std::size_t manifest_bits = fs::file_size(step_dir() + "/manifest.json") * 8;
  EXPECT_EQ(found["manifest.json"],
            static_cast<int>((manifest_bits + kManifestStride - 1) / kManifestStride));
  const std::size_t rank_file_bits = fs::file_size(step_dir() + "/rank-0.bin") * 8;
  const auto rank_file_flips =
      static_cast<int>((rank_file_bits + kRankFileStride - 1) / kRankFileStride);
  EXPECT_EQ(found["rank-0.bin"], rank_file_flips);
  EXPECT_EQ(found["rank-1.bin"], rank_file_flips);
  // "step-3\n" is 56 bits; '3' (0x33) flips to '2' and '1', the names of the other two steps.
  EXPECT_EQ(found["latest"], 54);
  EXPECT_EQ(counts["latest: names step-2, which loads whole"], 1);
  EXPECT_EQ(counts["latest: names step-1, which loads whole"], 1);
}

// The issue's case: a changed digit of the optimizer step count passed verify and resume, and
// training went on from the wrong counters.
TEST_F(CheckpointBitFlips, AFlippedOptimizerStepCountIsFound) {
  const std::string path = step_dir() + "/manifest.json";
  const std::string text = testing::read_whole_file(path);
  const std::size_t at = text.find("\"optimizer_steps\": 3");
  ASSERT_NE(at, std::string::npos);
  const BitFlip three_to_two(path, (at + std::string("\"optimizer_steps\": ").size()) * 8);
  Loader([&](RankContext& context, Trainer& trainer) {
    for (const Outcome& outcome :
         {outcome_of([&] {
            verify_checkpoint(root());
            return LoadedCheckpoint{};
          }),
          outcome_of([&] { return load_checkpoint(context, trainer, root()); })}) {
      ASSERT_TRUE(outcome.threw);
      EXPECT_THAT(outcome.message, HasSubstr(path + ": checksum mismatch (xxh3 "));
      EXPECT_THAT(outcome.message, HasSubstr("the manifest is corrupt or was edited"));
    }
  });
}

// `latest` is held to the form the writer gives it; anything else is one line that shows exactly
// what the file holds, escaped (a NUL cut the name short before, and control characters went
// raw to the terminal).
TEST_F(CheckpointBitFlips, LatestHoldsExactlyAStepNameOrSaysWhatItHolds) {
  struct Case {
    std::string text;
    std::string shown;
  };
  using namespace std::string_literals;
  const std::vector<Case> cases = {
      {"step-40\0junk"s, R"("step-40\x00junk")"},
      {"step-3\r\n", R"("step-3\r\n")"},
      {"\x1b]0;owned\x07step-3\n", R"("\x1b]0;owned\x07step-3\n")"},
      {"step-03\n", R"("step-03\n")"},
      {"step-3\n\n", R"("step-3\n\n")"},
      {" step-3\n", R"(" step-3\n")"},
      {"step-3 \n", R"("step-3 \n")"},
      {"step-3/\n", R"("step-3/\n")"},
      {"../ckpt/step-3\n", R"("../ckpt/step-3\n")"},
      {"STEP-3\n", R"("STEP-3\n")"},
      {"step-\n", R"("step-\n")"},
      {"step-1234567890123456789\n", R"("step-1234567890123456789\n")"},
      {"", R"("")"},
      {std::string(4000, '\x9b'), R"("\x9b\x9b)"},
  };
  Loader([&](RankContext& context, Trainer& trainer) {
    for (const Case& c : cases) {
      testing::write_whole_file(root() + "/latest", c.text);
      const std::string what = "latest " + c.shown;
      const Outcome verify = outcome_of([&] {
        verify_checkpoint(root());
        return LoadedCheckpoint{};
      });
      const Outcome load = outcome_of([&] { return load_checkpoint(context, trainer, root()); });
      for (const Outcome& outcome : {verify, load}) {
        ASSERT_TRUE(outcome.threw) << what;
        expect_clear(outcome, root() + "/latest holds " + c.shown, what);
        EXPECT_THAT(outcome.message, HasSubstr("not the name of a step directory")) << what;
      }
    }
    EXPECT_THAT(load_checkpoint(context, trainer, step_dir()).path, step_dir());
    // Without its newline (written by hand) it still names the step.
    testing::write_whole_file(root() + "/latest", "step-2");
    EXPECT_EQ(load_checkpoint(context, trainer, root()).step, 2);
    fs::create_directory(root() + "/step-7");
    testing::write_whole_file(root() + "/step-8", "a file");
    for (const auto& [text, said] :
         std::vector<std::pair<std::string, std::string>>{
             {"step-7\n", "latest names step-7, which has no manifest.json"},
             {"step-8\n", "latest names step-8, which is not a directory"},
             {"step-9\n", "latest names step-9, which does not exist in " + root()}}) {
      testing::write_whole_file(root() + "/latest", text);
      const Outcome load = outcome_of([&] { return load_checkpoint(context, trainer, root()); });
      expect_clear(load, said, text);
    }
  });
}

// A changed bit in a parameter's name is a checksum mismatch; a resume says which name differs.
TEST_F(CheckpointBitFlips, ARenamedParameterIsNamed) {
  const std::string path = step_dir() + "/manifest.json";
  std::string text = testing::read_whole_file(path);
  const std::size_t at = text.find("\"name\": \"weight\"");
  ASSERT_NE(at, std::string::npos);
  text[at + std::string("\"name\": \"weigh").size()] = 's';  // weight -> weighs
  testing::write_whole_file(path, text);
  Loader([&](RankContext& context, Trainer& trainer) {
    const Outcome verify = outcome_of([&] {
      verify_checkpoint(root());
      return LoadedCheckpoint{};
    });
    expect_clear(verify, path + ": checksum mismatch", "verify");
    const Outcome load = outcome_of([&] { return load_checkpoint(context, trainer, root()); });
    expect_clear(load, path + ": checksum mismatch", "load");
    EXPECT_THAT(load.message, HasSubstr("read regardless, it differs from this model: layer0: "
                                        "parameter 0 is 'weighs' in the checkpoint, 'weight' "
                                        "here"));
  });
}

// Cutting the checksum line off (an edit, or corruption at the end) is refused: the manifest
// declares near its top that it has one.
TEST_F(CheckpointBitFlips, AManifestThatLostItsChecksumLineIsRefused) {
  const std::string path = step_dir() + "/manifest.json";
  auto manifest = nlohmann::ordered_json::parse(testing::read_whole_file(path));
  ASSERT_TRUE(manifest.contains("checksum"));
  manifest.erase("manifest_xxh3");
  testing::write_whole_file(path, manifest.dump(2) + "\n");
  const Outcome verify = outcome_of([&] {
    verify_checkpoint(root());
    return LoadedCheckpoint{};
  });
  expect_clear(verify, path + ": declares a checksum but does not end with its line", "verify");
  EXPECT_FALSE(read_manifest(step_dir(), ManifestChecksum::kIgnore).manifest_xxh3);
}

// A manifest written before manifests carried a checksum (neither the declaration nor the line)
// still loads, unchecked, and says so; zest-ckpt reshard rewrites it with one.
TEST_F(CheckpointBitFlips, AManifestFromBeforeChecksumsStillLoads) {
  const std::string path = step_dir() + "/manifest.json";
  const CheckpointManifest sealed = read_manifest(step_dir());
  ASSERT_TRUE(sealed.manifest_xxh3);
  auto manifest = nlohmann::ordered_json::parse(testing::read_whole_file(path));
  manifest.erase("checksum");
  manifest.erase("manifest_xxh3");
  testing::write_whole_file(path, manifest.dump(2) + "\n");
  const CheckpointManifest old = read_manifest(step_dir());
  EXPECT_FALSE(old.manifest_xxh3);
  EXPECT_EQ(manifest_to_json(old), manifest_to_json(sealed));
  verify_checkpoint(root());
  Loader([&](RankContext& context, Trainer& trainer) {
    const LoadedCheckpoint loaded = load_checkpoint(context, trainer, root());
    EXPECT_EQ(loaded.step, 3);
    EXPECT_FALSE(loaded.manifest_checksum);
    EXPECT_TRUE(load_checkpoint(context, trainer, step_dir(2)).manifest_checksum);
  });
}

}  // namespace
}  // namespace zest
