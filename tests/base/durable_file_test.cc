// Durable writes: a file appears whole under its final name or not at all, and a failure names
// the file.
#include "base/durable_file.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "base/error.h"
#include "tests/support/scratch_directory.h"

namespace zest {
namespace {

namespace fs = std::filesystem;

class DurableFileTest : public zest::testing::ScratchDirectoryTest {
 protected:
  std::string read(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  std::size_t entries() {
    return static_cast<std::size_t>(
        std::distance(fs::directory_iterator(dir_), fs::directory_iterator()));
  }
};

TEST_F(DurableFileTest, TheTargetHoldsTheOldTextUntilCommit) {
  const std::string target = (dir_ / "out.json").string();
  write_file_durably(target, "old\n");
  DurableFile file(target);
  file.write("new\n");
  EXPECT_EQ(read(target), "old\n");  // still the old file: the new one is a temporary
  EXPECT_EQ(entries(), 2u);
  file.commit();
  EXPECT_EQ(read(target), "new\n");
  EXPECT_EQ(entries(), 1u);  // the temporary became the target
}

TEST_F(DurableFileTest, AWriterDestroyedWithoutCommitLeavesNothingBehind) {
  const std::string target = (dir_ / "out.bin").string();
  {
    DurableFile file(target);
    file.write("partial");
  }
  EXPECT_FALSE(fs::exists(target));
  EXPECT_EQ(entries(), 0u);
}

TEST_F(DurableFileTest, AFileInAMissingDirectoryIsAnErrorNamingIt) {
  const std::string target = (dir_ / "missing" / "out.bin").string();
  try {
    write_file_durably(target, "x");
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(error.what()).find((dir_ / "missing").string()), std::string::npos)
        << error.what();
  }
}

TEST_F(DurableFileTest, ASyncedFileRefusesToOverwrite) {
  const std::string path = (dir_ / "shard.bin").string();
  {
    SyncedFile file(path);
    file.write("abc", 3);
    file.finish();
  }
  EXPECT_EQ(read(path), "abc");
  EXPECT_THROW(SyncedFile{path}, Error);
  EXPECT_EQ(read(path), "abc");
}

TEST(RandomTag, IsSixteenHexDigitsAndDiffers) {
  const std::string a = random_tag();
  const std::string b = random_tag();
  EXPECT_EQ(a.size(), 16u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace zest
