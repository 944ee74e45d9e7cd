// The config file reader and `--set` refuse JSON nested deeper than kMaxJsonDepth with a clear
// error: nlohmann parses any depth, but copying or printing a value hundreds of thousands of
// levels deep overflows the stack (found by the hardening pass, docs/architecture.md).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "base/json_depth.h"
#include "config/train_config.h"

namespace zest {
namespace {

using ::testing::HasSubstr;

std::string nested(std::size_t levels) {
  return std::string(levels, '[') + std::string(levels, ']');
}

TEST(ConfigFile, DeeplyNestedJsonIsAClearConfigError) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("zest_config_file_test_" + std::to_string(::getpid()) + ".json"))
                               .string();
  std::ofstream(path) << R"({"model": {"type": "mlp", "sizes": [4, 4]}, "extra": )"
                      << nested(200'000) << "}";
  try {
    load_train_config(path);
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_THAT(error.what(), HasSubstr("nests deeper than 512 levels"));
    EXPECT_THAT(error.what(), HasSubstr(path));
  }
  std::filesystem::remove(path);
}

TEST(ConfigFile, DeeplyNestedOverrideIsAClearUsageError) {
  nlohmann::json config = nlohmann::json::object();
  try {
    apply_override(config, "extra=" + nested(kMaxJsonDepth + 1));
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUsage);
    EXPECT_THAT(error.what(), HasSubstr("--set 'extra=...': the value nests deeper than 512"));
  }
  apply_override(config, "extra=" + nested(kMaxJsonDepth));
  EXPECT_TRUE(config["extra"].is_array());
}

}  // namespace
}  // namespace zest
