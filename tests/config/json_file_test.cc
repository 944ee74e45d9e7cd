// The config file reader and `--set` refuse JSON nested deeper than kMaxJsonDepth with a clear
// error: nlohmann parses any depth, but copying or printing a value hundreds of thousands of
// levels deep overflows the stack (found by the hardening pass, docs/operating.md). A key
// written twice in one object and a number out of range are config errors naming the file and
// the JSON path.
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

class ConfigFileText : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove(path_); }

  // The kConfig message read_json_file gives for `text`, or "" when it parses.
  std::string error_for(const std::string& text) {
    std::ofstream(path_) << text;
    try {
      read_json_file(path_);
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kConfig);
      return error.what();
    }
    return "";
  }

  const std::string path_ = (std::filesystem::temp_directory_path() /
                             ("zest_config_text_" + std::to_string(::getpid()) + ".json"))
                                .string();
};

TEST_F(ConfigFileText, ANumberOutOfRangeNamesTheFileAndTheJsonPath) {
  EXPECT_EQ(error_for(R"({"optimizer": {"params": {"lr": 1e400}}})"),
            path_ + ": optimizer.params.lr: the number 1e400 is out of range; a JSON number here "
                    "must be finite (at most about 1.8e308)");
  EXPECT_EQ(error_for(R"({"model": {"sizes": [4, -1e999]}})"),
            path_ + ": model.sizes[1]: the number -1e999 is out of range; a JSON number here "
                    "must be finite (at most about 1.8e308)");
  EXPECT_EQ(error_for("1e400"), path_ + ": the top-level value: the number 1e400 is out of "
                                        "range; a JSON number here must be finite (at most "
                                        "about 1.8e308)");
}

TEST_F(ConfigFileText, AKeyWrittenTwiceInOneObjectIsAnError) {
  const std::string twice = ": the key appears twice in one object; write it once (a JSON "
                            "reader would silently keep only one of the values)";
  EXPECT_EQ(error_for(R"({"steps": 2, "seed": 1, "steps": 3})"), path_ + ": steps" + twice);
  EXPECT_EQ(error_for(R"({"optimizer": {"params": {"lr": 0.1, "betas": [0.9, 0.99], "lr": 1}}})"),
            path_ + ": optimizer.params.lr" + twice);
  EXPECT_EQ(error_for(R"({"a": [1, {"b": {}}, {"c": 1, "c": 2}]})"), path_ + ": a[2].c" + twice);
  // The same key in different objects is not twice.
  EXPECT_EQ(error_for(R"({"a": {"x": 1}, "b": {"x": 1}, "c": [{"x": 1}, {"x": 2}]})"), "");
}

TEST(ConfigOverride, AKeyWrittenTwiceInAValueIsAUsageError) {
  nlohmann::json config = nlohmann::json::object();
  try {
    apply_override(config, R"(optimizer={"type": "SGD", "params": {"lr": 1, "lr": 2}})");
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUsage);
    EXPECT_THAT(error.what(), HasSubstr("--set 'optimizer=...': optimizer.params.lr: the key "
                                        "appears twice in one object"));
  }
  // Text that is not JSON stays a string, a number out of range among it, as before.
  apply_override(config, "x=1e400");
  EXPECT_EQ(config["x"], "1e400");
}

// A byte that is not UTF-8 would make the resolved config unprintable at the first dump, far
// from the --set that brought it (nlohmann's type_error.316, with no key).
TEST(ConfigOverride, AValueThatIsNotUtf8IsAUsageErrorNamingTheKey) {
  nlohmann::json config = nlohmann::json::object();
  try {
    apply_override(config, "data.path=/data/\xff\xfe.bin");
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUsage);
    EXPECT_THAT(error.what(), HasSubstr("--set 'data.path=...': the value is not valid UTF-8 "
                                        "(byte 6)"));
  }
  EXPECT_FALSE(config.contains("data"));
  apply_override(config, "data.path=/data/日本.bin");
  EXPECT_EQ(config["data"]["path"], "/data/日本.bin");
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
