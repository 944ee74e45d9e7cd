// A test's own directory under the system's temporary folder, named for the suite, the test and
// the process, made empty before each test and removed after it. Fixtures of tests that write
// files (configs, data, checkpoints, a tool's output) derive from it and name files with path().
#pragma once

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace zest::testing {

class ScratchDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    // Parameterized names hold '/': one directory per test, not a tree.
    std::string name = std::string(info->test_suite_name()) + "_" + std::to_string(::getpid()) +
                       "_" + info->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // Writes `text` as the file `name` in the directory and returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name)) << text;
    return path(name);
  }

  std::filesystem::path dir_;
};

}  // namespace zest::testing
