#include "data/token_data.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "base/error.h"
#include "data/token_batches.h"
#include "tests/support/capture_error.h"

namespace zest {
namespace {

namespace fs = std::filesystem;

class TokenDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = fs::temp_directory_path() /
                 ("zest_token_data_" + std::to_string(::getpid()) + "_" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(directory_);
  }
  void TearDown() override { fs::remove_all(directory_); }
  std::string path(const std::string& name) const { return (directory_ / name).string(); }

  static std::string error_of(const std::function<void()>& action) {
    return zest::testing::error_message(action, ErrorKind::kData);
  }

  fs::path directory_;
};

TEST_F(TokenDataTest, ShardsRoundTripInFileNameOrder) {
  write_token_shard(path("b_001.bin"), {4, 5, 6});
  write_token_shard(path("b_000.bin"), {1, 2, 3});
  TokenData data = load_token_shards(path("b_*.bin"), 10);
  EXPECT_EQ(data.tokens, (std::vector<std::uint16_t>{1, 2, 3, 4, 5, 6}));
  ASSERT_EQ(data.files.size(), 2u);
  EXPECT_NE(data.files[0].find("b_000.bin"), std::string::npos);
}

TEST_F(TokenDataTest, TruncatedShardIsAClearError) {
  write_token_shard(path("t.bin"), {1, 2, 3, 4});
  fs::resize_file(path("t.bin"), fs::file_size(path("t.bin")) - 3);
  const std::string message = error_of([&] { load_token_shards(path("t.bin"), 10); });
  EXPECT_NE(message.find("promises 4 tokens"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
}

TEST_F(TokenDataTest, TruncatedHeaderIsAClearError) {
  std::ofstream(path("h.bin"), std::ios::binary) << "short";
  EXPECT_NE(error_of([&] { load_token_shards(path("h.bin"), 10); }).find("truncated header"),
            std::string::npos);
}

TEST_F(TokenDataTest, WrongMagicIsAClearError) {
  write_token_shard(path("m.bin"), {1, 2});
  {
    std::fstream file(path("m.bin"), std::ios::in | std::ios::out | std::ios::binary);
    const std::int32_t wrong = 12345;
    file.write(reinterpret_cast<const char*>(&wrong), sizeof(wrong));
  }
  const std::string message = error_of([&] { load_token_shards(path("m.bin"), 10); });
  EXPECT_NE(message.find("wrong magic 12345"), std::string::npos) << message;
  EXPECT_NE(message.find("20240520"), std::string::npos) << message;
}

TEST_F(TokenDataTest, TokenAtOrAboveVocabularyIsAClearError) {
  write_token_shard(path("v.bin"), {1, 2, 10});
  const std::string message = error_of([&] { load_token_shards(path("v.bin"), 10); });
  EXPECT_NE(message.find("offset 1028: token 10 is not below model.vocab_size (10)"),
            std::string::npos)
      << message;
}

// A shard whose header has `count` in place of the real token count.
std::string shard_bytes(std::int32_t count, const std::vector<std::uint16_t>& tokens) {
  std::int32_t header[kTokenShardHeaderInts] = {};
  header[0] = kTokenShardMagic;
  header[1] = kTokenShardVersion;
  header[2] = count;
  std::string bytes(reinterpret_cast<const char*>(header), sizeof header);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return bytes;
}

// Note: the count is an int32 in llm.c's header, so the largest promise a shard can make is
// 2^31 - 1 tokens (4 GiB); it is compared with the file's size before anything is allocated.
TEST_F(TokenDataTest, HeaderPromisingBillionsOfTokensIsRefusedBeforeAllocating) {
  std::ofstream(path("huge.bin"), std::ios::binary) << shard_bytes(2147483647, {1, 2});
  const std::string message = error_of([&] { load_token_shards(path("huge.bin"), 10); });
  EXPECT_NE(message.find("promises 2147483647 tokens (4294968318 bytes in all) but the file has "
                         "1028 bytes"),
            std::string::npos)
      << message;
}

TEST_F(TokenDataTest, NegativeTokenCountIsAClearError) {
  std::ofstream(path("negative.bin"), std::ios::binary) << shard_bytes(-1, {1});
  const std::string message = error_of([&] { load_token_shards(path("negative.bin"), 10); });
  EXPECT_NE(message.find("offset 8: the header's token count -1 is negative"), std::string::npos)
      << message;
}

TEST_F(TokenDataTest, InMemoryReadersNameTheirSource) {
  TokenData data;
  append_token_shard(shard_bytes(2, {3, 4}), "memory.bin", 10, data);
  EXPECT_EQ(data.tokens, (std::vector<std::uint16_t>{3, 4}));
  EXPECT_EQ(data.files, (std::vector<std::string>{"memory.bin"}));
  // A refused shard adds nothing.
  EXPECT_NE(error_of([&] { append_token_shard(shard_bytes(1, {11}), "bad.bin", 10, data); })
                .find("bad.bin: offset 1024: token 11"),
            std::string::npos);
  EXPECT_EQ(data.tokens.size(), 2u);
  EXPECT_EQ(text_tokens("ab", "memory.txt").tokens, (std::vector<std::uint16_t>{'a', 'b'}));
  EXPECT_NE(error_of([&] { text_tokens("", "memory.txt"); })
                .find("memory.txt: the text file is empty"),
            std::string::npos);
}

TEST_F(TokenDataTest, NoMatchingFileIsAClearError) {
  EXPECT_NE(error_of([&] { load_token_shards(path("none_*.bin"), 10); }).find("no file matches"),
            std::string::npos);
}

TEST_F(TokenDataTest, EmptyTextFileIsAClearError) {
  std::ofstream(path("empty.txt")).close();
  EXPECT_NE(error_of([&] { load_text_tokens(path("empty.txt")); }).find("empty"),
            std::string::npos);
}

// Refused by name before they are opened (a directory failed inside the stream library with
// "basic_filebuf::underflow error", /dev/zero was read until memory ran out), under the config
// key that gave the path.
TEST_F(TokenDataTest, APathThatIsNotARegularFileIsRefusedByName) {
  const std::string folder = directory_.string();
  EXPECT_EQ(error_of([&] { load_text_tokens(folder); }),
            "data.path: data file '" + folder + "' is a directory, not a regular file");
  EXPECT_EQ(error_of([&] { load_text_tokens("/dev/null", "data.val_path"); }),
            "data.val_path: data file '/dev/null' is a character device, not a regular file");
  fs::create_directories(path("shard_000.bin"));
  EXPECT_EQ(error_of([&] { load_token_shards(path("shard_*.bin"), 10); }),
            "data.path: data file '" + path("shard_000.bin") +
                "' is a directory, not a regular file");
}

// /proc/self/mem is a regular file that fails every read at offset 0 (EIO): the message names
// the key, the file, the offset and the reason, not the stream library's "underflow".
TEST_F(TokenDataTest, AFailedReadNamesTheFileTheOffsetAndTheReason) {
  const std::string message = error_of([&] { load_text_tokens("/proc/self/mem", "data.path"); });
  EXPECT_EQ(message, "data.path: '/proc/self/mem': offset 0: cannot read (Input/output error)");
}

TEST_F(TokenDataTest, ALongPathIsCutInTheMessage) {
  const std::string missing = path(std::string(300, 'x')) + "/" + std::string(4700, 'y');
  const std::string message = error_of([&] { load_text_tokens(missing, "data.path"); });
  EXPECT_LT(message.size(), 400u) << message;
  EXPECT_NE(message.find("(" + std::to_string(missing.size()) +
                         " bytes) cannot be read (File name too long)"),
            std::string::npos)
      << message;
}

TEST_F(TokenDataTest, TextIsReadAsBytes) {
  std::ofstream(path("a.txt"), std::ios::binary) << "hi\xff";
  TokenData data = load_text_tokens(path("a.txt"));
  EXPECT_EQ(data.tokens, (std::vector<std::uint16_t>{'h', 'i', 255}));
}

std::shared_ptr<TokenData> counting_tokens(std::size_t count) {
  auto data = std::make_shared<TokenData>();
  for (std::size_t i = 0; i < count; ++i) data->tokens.push_back(static_cast<std::uint16_t>(i));
  return data;
}

TEST(TokenBatches, RankSlicesTogetherEqualTheGlobalBatch) {
  auto data = counting_tokens(1000);
  TokenBatches batches = TokenBatches::training(data, 8, 7, 0.0);
  const int rows = 12;
  std::vector<std::int32_t> whole_in(rows * 8), whole_target(rows * 8);
  batches.fill(3, rows, 0, rows, whole_in.data(), whole_target.data());
  for (int world : {2, 3, 4}) {
    std::vector<std::int32_t> in(rows * 8), target(rows * 8);
    const int local = rows / world;
    for (int rank = 0; rank < world; ++rank) {
      batches.fill(3, rows, rank * local, local, in.data() + rank * local * 8,
                   target.data() + rank * local * 8);
    }
    EXPECT_EQ(in, whole_in) << "world " << world;
    EXPECT_EQ(target, whole_target) << "world " << world;
  }
  // Targets are the inputs shifted by one token.
  for (int row = 0; row < rows; ++row) {
    EXPECT_EQ(whole_target[row * 8], whole_in[row * 8] + 1);
  }
}

TEST(TokenBatches, EveryEpochVisitsEveryWindowOnce) {
  auto data = counting_tokens(8 * 37 + 1);
  TokenBatches batches = TokenBatches::training(data, 8, 99, 0.0);
  ASSERT_EQ(batches.windows(), 37);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::set<std::int32_t> starts;
    std::vector<std::int32_t> in(8), target(8);
    for (int sequence = 0; sequence < 37; ++sequence) {
      batches.fill(epoch * 37 + sequence, 1, 0, 1, in.data(), target.data());
      starts.insert(in[0]);
    }
    EXPECT_EQ(starts.size(), 37u) << "epoch " << epoch;
  }
}

TEST(TokenBatches, ValidationWindowsAreHeldOutOfTraining) {
  auto data = counting_tokens(8 * 20 + 1);
  TokenBatches train = TokenBatches::training(data, 8, 1, 0.25);
  TokenBatches validation = TokenBatches::validation(data, 8, 0.25);
  EXPECT_EQ(train.windows() + validation.windows(), 20);
  std::vector<std::int32_t> in(8), target(8);
  for (int sequence = 0; sequence < train.windows(); ++sequence) {
    train.fill(sequence, 1, 0, 1, in.data(), target.data());
    EXPECT_LT(in[0], 8 * train.windows());
  }
  validation.fill(0, 1, 0, 1, in.data(), target.data());
  EXPECT_EQ(in[0], 8 * train.windows());
}

// One byte of text is no whole window: 0 windows, not -1 (a validation split of nothing).
TEST(TokenBatches, DataOfNoWholeWindowCountsZeroWindowsWithAValidationSplit) {
  try {
    TokenBatches::training(counting_tokens(1), 8, 1, 0.05);
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("(0 windows of model.seq_len + 1 = 9 tokens)"),
              std::string::npos)
        << error.what();
  }
}

TEST(TokenBatches, TooFewTokensIsAClearError) {
  auto data = counting_tokens(5);
  try {
    TokenBatches::training(data, 8, 1, 0.0);
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("not enough tokens"), std::string::npos);
  }
}

}  // namespace
}  // namespace zest
