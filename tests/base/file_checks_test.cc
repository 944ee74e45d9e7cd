// The path checks made before a file is opened or written: what is not a regular file is
// refused by name with what it is; an output's folder must exist and be a writable directory.
#include "base/file_checks.h"
#include "tests/support/capture_error.h"
#include "tests/support/scratch_directory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

namespace zest {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class FileChecks : public zest::testing::ScratchDirectoryTest {
 protected:
  void SetUp() override {
    ScratchDirectoryTest::SetUp();
    std::ofstream(path("file.txt")) << "x";
    fs::create_directories(path("folder"));
    EXPECT_EQ(::mkfifo(path("pipe").c_str(), 0644), 0);
  }

  static std::string error_of(const std::function<void()>& action) {
    return zest::testing::error_message(action, ErrorKind::kData);
  }

};

TEST_F(FileChecks, KindsAreNamed) {
  EXPECT_EQ(file_kind(path("file.txt")), "a regular file");
  EXPECT_EQ(file_kind(path("folder")), "a directory");
  EXPECT_EQ(file_kind(path("pipe")), "a FIFO");
  EXPECT_EQ(file_kind("/dev/null"), "a character device");
  EXPECT_EQ(file_kind(path("absent")), "missing");
}

TEST_F(FileChecks, InputsThatAreNotRegularFilesAreRefused) {
  auto refuse = [](const std::string& p) {
    return error_of([&] { refuse_non_regular_file(p, ErrorKind::kData, "data file"); });
  };
  EXPECT_EQ(refuse(path("file.txt")), "");
  EXPECT_EQ(refuse(path("absent")), "");  // its reader names a missing file as it always has
  EXPECT_EQ(refuse(path("pipe")), "data file '" + path("pipe") + "' is a FIFO, not a regular file");
  EXPECT_EQ(refuse(path("folder")),
            "data file '" + path("folder") + "' is a directory, not a regular file");
  EXPECT_EQ(refuse("/dev/zero"), "data file '/dev/zero' is a character device, not a regular file");
  // A symbolic link is followed: to a file it passes, to a FIFO it is refused.
  fs::create_symlink(path("file.txt"), path("to_file"));
  fs::create_symlink(path("pipe"), path("to_pipe"));
  EXPECT_EQ(refuse(path("to_file")), "");
  EXPECT_THAT(refuse(path("to_pipe")), HasSubstr("is a FIFO"));
}

TEST_F(FileChecks, AnOutputFileNeedsAWritableFolderAndNoOtherKindInItsPlace) {
  auto check = [](const std::string& p) {
    return error_of([&] { check_output_file(p, ErrorKind::kData, "--out"); });
  };
  EXPECT_EQ(check(path("new.json")), "");
  EXPECT_EQ(check(path("file.txt")), "");  // written over
  EXPECT_EQ(check(path("folder")),
            "--out '" + path("folder") + "' is a directory; give the path of a file to write");
  EXPECT_THAT(check(path("pipe")), HasSubstr("is a FIFO"));
  EXPECT_EQ(check(path("absent/new.json")), "--out '" + path("absent/new.json") +
                                                "': its folder '" + path("absent") +
                                                "' does not exist");
  EXPECT_EQ(check(path("file.txt/new.json")), "--out '" + path("file.txt/new.json") + "': '" +
                                                  path("file.txt") +
                                                  "' is a regular file, not a directory");
  EXPECT_EQ(check(""), "--out: the path is empty");
}

TEST_F(FileChecks, AnOutputDirectoryNeedsAWritableDirectoryOrAncestor) {
  auto check = [](const std::string& p) {
    return error_of([&] { check_output_directory(p, ErrorKind::kData, "checkpoint.dir"); });
  };
  EXPECT_EQ(check(path("folder")), "");
  EXPECT_EQ(check(path("new/deeper/still")), "");  // created with its parents
  EXPECT_EQ(check(path("file.txt")),
            "checkpoint.dir '" + path("file.txt") + "' is a regular file, not a directory");
  EXPECT_EQ(check(path("file.txt/sub")), "checkpoint.dir '" + path("file.txt/sub") + "': '" +
                                             path("file.txt") +
                                             "' is a regular file, not a directory");
  EXPECT_THAT(check(path("pipe")), HasSubstr("is a FIFO, not a directory"));
}

TEST_F(FileChecks, PathsAreEscapedInMessages) {
  const std::string odd = path("a\x1b[2Jb");
  std::ofstream(odd) << "x";
  EXPECT_THAT(error_of([&] { check_output_directory(odd, ErrorKind::kData, "checkpoint.dir"); }),
              HasSubstr("a\\x1b[2Jb"));
}

}  // namespace
}  // namespace zest
