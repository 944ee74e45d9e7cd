// What a checkpoint that does not fit, or went bad, does: every case is an Error on every rank
// that names what is wrong (the differing parameters, the file), and a save that fails midway
// (a full disk, simulated) leaves the previous checkpoint and `latest` untouched.
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "checkpoint/files.h"
#include "checkpoint/manifest.h"
#include "checkpoint/reshard.h"
#include "tests/checkpoint/checkpoint_test_support.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDirectory;
using testing::train_mlp;
using testing::TrainSpec;

namespace fs = std::filesystem;

// Runs `run` and returns the Error it throws (failing the test if none).
Error error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const Error& error) {
    return error;
  }
  ADD_FAILURE() << "no Error thrown";
  return Error(ErrorKind::kInternal, "");
}

class CheckpointBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    TrainSpec spec;
    spec.world = 2;
    spec.stage = 1;
    spec.steps = 2;
    spec.save_dir = root();
    spec.save_at = 2;
    train_mlp(spec);
  }
  std::string root() const { return scratch_.path("ckpt"); }
  std::string step_dir() const { return root() + "/step-2"; }

  // Loads the checkpoint into a world-2 MLP (of `sizes`) and returns the error.
  Error load_error(std::vector<std::int64_t> sizes = {13, 31, 17, 7}, int world = 2) const {
    TrainSpec spec;
    spec.world = world;
    spec.sizes = std::move(sizes);
    spec.steps = 0;
    spec.resume = root();
    return error_of([&] { train_mlp(spec); });
  }

  ScratchDirectory scratch_;
};

TEST_F(CheckpointBadInput, AnotherModelListsTheDifferences) {
  const Error error = load_error({13, 30, 17, 7});
  EXPECT_EQ(error.kind(), ErrorKind::kCheckpoint);
  EXPECT_THAT(error.what(), HasSubstr("another model"));
  EXPECT_THAT(error.what(),
              HasSubstr("layer0.weight: shape [31, 13] in the checkpoint, [30, 13] here"));
  EXPECT_THAT(error.what(),
              HasSubstr("layer1.weight: shape [17, 31] in the checkpoint, [17, 30] here"));

  const Error fewer = load_error({13, 31, 7});
  EXPECT_THAT(fewer.what(), HasSubstr("the checkpoint has 3 units, this model 2"));
}

TEST_F(CheckpointBadInput, AMissingShardFileIsNamed) {
  fs::remove(step_dir() + "/rank-1.bin");
  const Error error = load_error();
  EXPECT_EQ(error.kind(), ErrorKind::kCheckpoint);
  EXPECT_THAT(error.what(), HasSubstr("rank-1.bin: missing"));
  EXPECT_THAT(error_of([&] { verify_checkpoint(root()); }).what(), HasSubstr("rank-1.bin"));
}

TEST_F(CheckpointBadInput, AFlippedByteIsDetectedByVerifyAndByLoad) {
  testing::flip_byte(step_dir() + "/rank-0.bin", 100);
  const Error verify = error_of([&] { verify_checkpoint(root()); });
  EXPECT_EQ(verify.kind(), ErrorKind::kCheckpoint);
  EXPECT_THAT(verify.what(), HasSubstr("rank-0.bin: checksum mismatch"));
  const Error load = load_error();
  EXPECT_THAT(load.what(), HasSubstr("rank-0.bin: checksum mismatch"));
  // Resharding reads every old file a new shard needs: rank 0's too.
  EXPECT_THAT(load_error({13, 31, 17, 7}, 1).what(), HasSubstr("rank-0.bin: checksum mismatch"));
}

TEST_F(CheckpointBadInput, ATruncatedShardFileIsNamed) {
  fs::resize_file(step_dir() + "/rank-1.bin", 64);
  EXPECT_THAT(load_error().what(), HasSubstr("rank-1.bin: 64 bytes, the manifest says"));
}

TEST_F(CheckpointBadInput, ANewerFormatVersionSaysSo) {
  auto manifest = nlohmann::json::parse(testing::read_whole_file(step_dir() + "/manifest.json"));
  manifest["format_version"] = kCheckpointFormatVersion + 1;
  manifest["something_new"] = true;
  testing::write_whole_file(step_dir() + "/manifest.json", manifest.dump());
  const Error error = load_error();
  EXPECT_EQ(error.kind(), ErrorKind::kCheckpoint);
  EXPECT_THAT(error.what(), HasSubstr("format version 2 is newer than this zest"));
}

TEST_F(CheckpointBadInput, AMalformedManifestNamesTheKey) {
  auto manifest = nlohmann::json::parse(testing::read_whole_file(step_dir() + "/manifest.json"));
  manifest["units"][1].erase("shard_length");
  testing::write_whole_file(step_dir() + "/manifest.json", manifest.dump());
  EXPECT_THAT(load_error().what(), HasSubstr("units[1].shard_length is missing"));
  testing::write_whole_file(step_dir() + "/manifest.json", "{ not json");
  EXPECT_THAT(load_error().what(), HasSubstr("manifest.json: not valid JSON"));
}

TEST_F(CheckpointBadInput, AKeyWrittenTwiceIsRefusedByItsPath) {
  // nlohmann keeps the last of two equal keys silently; a reader of the file believes the first.
  // (Reprinted without its checksum line, which would report the edit first.)
  const std::string text =
      nlohmann::json::parse(testing::read_whole_file(step_dir() + "/manifest.json")).dump(2);
  ASSERT_EQ(text.front(), '{');
  testing::write_whole_file(step_dir() + "/manifest.json", R"({"step": 1,)" + text.substr(1));
  Error error = load_error();
  EXPECT_EQ(error.kind(), ErrorKind::kCheckpoint);
  EXPECT_THAT(error.what(), HasSubstr("manifest.json: step: the key appears twice in one object"));

  const std::string scaler = R"("loss_scaler": {)";
  const std::size_t at = text.find(scaler);
  ASSERT_NE(at, std::string::npos);
  testing::write_whole_file(step_dir() + "/manifest.json",
                            text.substr(0, at + scaler.size()) + R"("scale": 1.0,)" +
                                text.substr(at + scaler.size()));
  error = load_error();
  EXPECT_EQ(error.kind(), ErrorKind::kCheckpoint);
  EXPECT_THAT(error.what(), HasSubstr("manifest.json: counters.loss_scaler.scale: the key "
                                      "appears twice in one object"));
  // Refused while parsing: a reader that skips the checksum refuses it too.
  try {
    parse_manifest(R"({"step": 1,)" + text.substr(1), "manifest.json", ManifestChecksum::kIgnore);
    ADD_FAILURE() << "a key written twice was read";
  } catch (const Error& read_error) {
    EXPECT_THAT(read_error.what(), HasSubstr("manifest.json: step: the key appears twice"));
  }
}

TEST_F(CheckpointBadInput, LatestPointingNowhereSaysWhere) {
  testing::write_whole_file(root() + "/latest", "step-99\n");
  const Error error = load_error();
  EXPECT_EQ(error.kind(), ErrorKind::kCheckpoint);
  EXPECT_THAT(error.what(), HasSubstr("latest names step-99, which does not exist"));
  fs::remove(root() + "/latest");
  EXPECT_THAT(load_error().what(), HasSubstr("neither manifest.json nor a latest file"));
  EXPECT_THAT(error_of([&] { resolve_checkpoint(scratch_.path("nowhere")); }).what(),
              HasSubstr("does not exist"));
}

// A huge `latest` or manifest.json is refused by its size, before it is read into memory (the
// manifest here is sparse: 65 MiB long, nothing written).
TEST_F(CheckpointBadInput, AnOversizedLatestOrManifestIsRefusedBeforeReading) {
  testing::write_whole_file(root() + "/latest", std::string(5000, 's'));
  Error error = load_error();
  EXPECT_EQ(error.kind(), ErrorKind::kCheckpoint);
  EXPECT_THAT(error.what(), HasSubstr("latest: 5000 bytes, more than the latest pointer can be "
                                      "(4096 bytes): not a zest checkpoint file"));
  testing::write_whole_file(root() + "/latest", "step-2\n");
  fs::resize_file(step_dir() + "/manifest.json", (65ull << 20));
  error = load_error();
  EXPECT_EQ(error.kind(), ErrorKind::kCheckpoint);
  EXPECT_THAT(error.what(), HasSubstr("manifest.json: 68157440 bytes, more than a manifest can be "
                                      "(67108864 bytes)"));
}

TEST_F(CheckpointBadInput, AnotherOptimizerIsRefused) {
  TrainSpec spec;
  spec.world = 2;
  spec.optimizer = "SGD";
  spec.steps = 0;
  spec.resume = root();
  const Error error = error_of([&] { train_mlp(spec); });
  EXPECT_THAT(error.what(), HasSubstr("saved with another optimizer"));
}

// Size fields are checked in arithmetic that cannot wrap before anything is sized from them: a
// manifest claiming giant sizes is a clear kCheckpoint error naming the key, never a wrapped
// size, a division by zero (reshard) or a bad_alloc. Unit 0 is layer0: weight [31, 13] and bias
// [31], 434 elements padded to 448 (world 2 × alignment 32 = 64).
class CheckpointManifestSizes : public CheckpointBadInput {
 protected:
  // Edits the saved manifest and returns the error read_manifest throws for it.
  Error edited_manifest_error(const std::function<void(nlohmann::json&)>& edit) const {
    const std::string path = step_dir() + "/manifest.json";
    auto manifest = nlohmann::json::parse(testing::read_whole_file(path));
    edit(manifest);
    testing::write_whole_file(path, manifest.dump());
    const Error error = error_of([&] { read_manifest(step_dir()); });
    EXPECT_EQ(error.kind(), ErrorKind::kCheckpoint) << error.what();
    return error;
  }
};

constexpr std::uint64_t k2To61 = std::uint64_t{1} << 61;
constexpr std::uint64_t k2To62 = std::uint64_t{1} << 62;

TEST_F(CheckpointManifestSizes, GiantUnitLengthsAreRefused) {
  EXPECT_THAT(edited_manifest_error([](nlohmann::json& m) {
                m["units"][0]["flat_length"] = k2To62;
                m["units"][0]["shard_length"] = k2To61;
              }).what(),
              HasSubstr("units[0].flat_length is 4611686018427387904; numel 434 padded to a "
                        "multiple of world_size × shard_alignment (64) is 448"));
  // Consistent but giant: 2^61 elements per rank of three fp32 tensors.
  EXPECT_THAT(edited_manifest_error([](nlohmann::json& m) {
                m["units"][0]["numel"] = k2To62;
                m["units"][0]["flat_length"] = k2To62;
                m["units"][0]["shard_length"] = k2To61;
                m["units"][0]["params"] = {
                    {{"name", "weight"}, {"shape", {1u << 31, 1u << 31}}, {"offset", 0}}};
              }).what(),
              HasSubstr("units[0] makes rank files larger than 2^63 bytes"));
}

TEST_F(CheckpointManifestSizes, AShapeWhoseProductWrapsIsRefused) {
  // 2^32 × 2^32 wraps to 0 in 64 bits: with the bias moved to offset 0 and grown to the unit's
  // numel, the offsets would add up.
  EXPECT_THAT(edited_manifest_error([](nlohmann::json& m) {
                m["units"][0]["params"][0]["shape"] = {std::uint64_t{1} << 32,
                                                       std::uint64_t{1} << 32};
                m["units"][0]["params"][1]["shape"] = {434};
                m["units"][0]["params"][1]["offset"] = 0;
              }).what(),
              HasSubstr("units[0].params[0].shape has more elements than the unit's numel (434)"));
}

TEST_F(CheckpointManifestSizes, AGiantShardAlignmentIsRefusedBeforeResharding) {
  EXPECT_THAT(edited_manifest_error([](nlohmann::json& m) {
                m["shard_alignment"] = std::numeric_limits<std::int64_t>::max();
              }).what(),
              HasSubstr("units[0].flat_length is 448; numel 434 padded to a multiple of "
                        "world_size × shard_alignment (18446744073709551614) is "
                        "18446744073709551614"));
  // 2^62 fits with world 2 but not with 4 ranks: resharding to 4 divided by zero before.
  edited_manifest_error([](nlohmann::json& m) { m["shard_alignment"] = k2To62; });
  const Error error =
      error_of([&] { reshard_checkpoint(step_dir(), scratch_.path("resharded"), 4); });
  EXPECT_EQ(error.kind(), ErrorKind::kCheckpoint);
  EXPECT_THAT(error.what(), HasSubstr("units[0].flat_length is 448"));
}

TEST_F(CheckpointManifestSizes, ANumberPastInt64IsNamedAsWritten) {
  EXPECT_THAT(edited_manifest_error([](nlohmann::json& m) {
                m["step"] = std::numeric_limits<std::uint64_t>::max();
              }).what(),
              HasSubstr("step is 18446744073709551615, outside [0, 9223372036854775807]"));
}

// Found by tests/fuzz/manifest_fuzzer.cc (tests/fuzz/regressions/manifest/): a loss scale past
// float's range was read as inf, which a rewritten manifest (zest-ckpt reshard) stores as null.
TEST_F(CheckpointManifestSizes, ALossScalePastFloatIsRefused) {
  EXPECT_THAT(edited_manifest_error([](nlohmann::json& m) {
                m["counters"]["loss_scaler"]["scale"] = 1e39;
              }).what(),
              HasSubstr("counters.loss_scaler.scale is 1e+39, not a positive float"));
}

TEST_F(CheckpointManifestSizes, ADeeplyNestedManifestIsRefused) {
  // Parsing takes any depth; copying the value (the manifest keeps `config` and `extra`)
  // recursed once per level and overflowed the stack.
  const std::size_t levels = 200'000;
  testing::write_whole_file(step_dir() + "/manifest.json",
                            R"({"extra": )" + std::string(levels, '[') +
                                std::string(levels, ']') + "}");
  const Error error = load_error();
  EXPECT_EQ(error.kind(), ErrorKind::kCheckpoint);
  EXPECT_THAT(error.what(), HasSubstr("manifest.json: nests deeper than 512 levels"));
}

// A full disk at any point of a save: every rank throws, the error names the file and the OS
// error, the temporary directory is gone and step-2 with `latest` still loads.
class CheckpointDiskFull : public CheckpointBadInput,
                           public ::testing::WithParamInterface<std::tuple<int, std::uint64_t>> {};

TEST_P(CheckpointDiskFull, LeavesThePreviousCheckpointUntouched) {
  const auto [rank, after_bytes] = GetParam();
  const std::string latest_before = testing::read_whole_file(root() + "/latest");
  TrainSpec spec;
  spec.world = 2;
  spec.stage = 1;
  spec.steps = 3;
  spec.resume = root();
  spec.save_dir = root();
  spec.save_at = 3;
  spec.save_options.fail_after_bytes = after_bytes;
  spec.save_options.fail_rank = rank;
  const Error error = error_of([&] { train_mlp(spec); });
  EXPECT_THAT(error.what(), HasSubstr("No space left on device"));
  EXPECT_THAT(error.what(), HasSubstr(root()));
  EXPECT_EQ(testing::read_whole_file(root() + "/latest"), latest_before);
  for (const auto& entry : fs::directory_iterator(root())) {
    const std::string name = entry.path().filename().string();
    EXPECT_TRUE(name == "latest" || name == "step-2") << "left behind: " << name;
  }
  verify_checkpoint(root());
  TrainSpec again;
  again.world = 2;
  again.steps = 2;
  again.resume = root();
  EXPECT_EQ(train_mlp(again).loaded.step, 2);
}

// Rank files of this model are a few KiB: 100 bytes fails inside a shard file; rank 0 with a
// budget just above its shard fails writing the manifest or `latest`.
INSTANTIATE_TEST_SUITE_P(Points, CheckpointDiskFull,
                         ::testing::Values(std::make_tuple(1, std::uint64_t{100}),
                                           std::make_tuple(0, std::uint64_t{0}),
                                           std::make_tuple(-1, std::uint64_t{4096})),
                         [](const auto& info) {
                           const int rank = std::get<0>(info.param);
                           return (rank < 0 ? std::string("every_rank")
                                            : "rank" + std::to_string(rank)) +
                                  "_after_" + std::to_string(std::get<1>(info.param));
                         });

TEST_F(CheckpointBadInput, DiskFullWhileWritingTheManifestOrLatest) {
  TrainSpec spec;
  spec.world = 2;
  spec.stage = 1;
  spec.steps = 3;
  spec.resume = root();
  spec.save_at = 3;
  spec.save_options.fail_rank = 0;
  // The manifest a step-3 save writes, measured by a save into another root.
  spec.save_dir = scratch_.path("probe");
  train_mlp(spec);
  const std::uint64_t manifest = fs::file_size(scratch_.path("probe") + "/step-3/manifest.json");
  const std::uint64_t shard = read_manifest(step_dir()).rank_file_bytes();

  struct Case {
    std::uint64_t budget;  // rank 0's bytes before the disk is full
    const char* file;      // the file that cannot be written then
  };
  // "step-3\n" is 7 bytes: 3 of them fit.
  for (const Case& c : {Case{shard + 10, "manifest.json"}, Case{shard + manifest + 3, "latest"}}) {
    spec.save_dir = root();
    spec.save_options.fail_after_bytes = c.budget;
    const Error error = error_of([&] { train_mlp(spec); });
    EXPECT_THAT(error.what(), HasSubstr("No space left on device"));
    EXPECT_THAT(error.what(), HasSubstr(c.file));
    EXPECT_EQ(testing::read_whole_file(root() + "/latest"), "step-2\n");
    EXPECT_FALSE(fs::exists(root() + "/step-3")) << c.file;
    verify_checkpoint(root());
  }
}

TEST_F(CheckpointBadInput, TheFaultVariableWorksForAWholeProcess) {
  ::setenv(kCheckpointFaultVariable, "50", 1);
  TrainSpec spec;
  spec.world = 2;
  spec.steps = 3;
  spec.resume = root();
  spec.save_dir = root();
  spec.save_at = 3;
  const Error error = error_of([&] { train_mlp(spec); });
  ::unsetenv(kCheckpointFaultVariable);
  EXPECT_THAT(error.what(), HasSubstr(kCheckpointFaultVariable));
  EXPECT_EQ(testing::read_whole_file(root() + "/latest"), "step-2\n");
}

}  // namespace
}  // namespace zest
