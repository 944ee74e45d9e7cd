// The strict JSON reader refuses what nlohmann accepts silently (a key written twice) and names
// where text goes wrong: the JSON path for a key or a number, the line and column for syntax.
#include "base/strict_json.h"

#include <string>
#include <variant>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace zest {
namespace {

using ::testing::HasSubstr;

JsonFault fault_of(const std::string& text, const std::string& root = "") {
  auto parsed = parse_strict_json(text, root);
  if (auto* fault = std::get_if<JsonFault>(&parsed)) return *fault;
  ADD_FAILURE() << "no fault for " << text;
  return {};
}

TEST(StrictJson, ParsesGoodText) {
  auto parsed = parse_strict_json(R"({"a": [1, 2.5, "x"], "b": {"c": true}})");
  ASSERT_TRUE(std::holds_alternative<nlohmann::json>(parsed));
  EXPECT_EQ(std::get<nlohmann::json>(parsed)["b"]["c"], true);
}

TEST(StrictJson, AKeyWrittenTwiceIsNamedByItsPath) {
  JsonFault fault = fault_of(R"({"a": {"b": 1, "b": 2}})");
  EXPECT_EQ(fault.kind, JsonFault::Kind::kDuplicateKey);
  EXPECT_EQ(fault.path, "a.b");
  fault = fault_of(R"({"a": [{}, {"k": 1, "k": 1}]})");
  EXPECT_EQ(fault.path, "a[1].k");
  // Equal keys in different objects are fine.
  EXPECT_TRUE(std::holds_alternative<nlohmann::json>(parse_strict_json(R"([{"k": 1}, {"k": 2}])")));
  // A root names where the value lives in a larger document.
  EXPECT_EQ(fault_of(R"({"type": 1, "type": 2})", "optimizer").path, "optimizer.type");
}

TEST(StrictJson, ANumberOutOfRangeIsNamedByItsPath) {
  const JsonFault fault = fault_of(R"({"sizes": [1, -1e999]})");
  EXPECT_EQ(fault.kind, JsonFault::Kind::kNumberOutOfRange);
  EXPECT_EQ(fault.path, "sizes[1]");
  EXPECT_EQ(fault.number, "-1e999");
  EXPECT_EQ(fault_of("1e400").path, "the top-level value");
}

TEST(StrictJson, ASyntaxErrorHasALineAndColumn) {
  const JsonFault fault = fault_of("{\n  \"a\": 1,\n  \"b\": x\n}");
  EXPECT_EQ(fault.kind, JsonFault::Kind::kSyntax);
  EXPECT_EQ(fault.line, 3u);
  EXPECT_EQ(fault.column, 8u);
  EXPECT_THAT(fault.reason, HasSubstr("syntax error"));
  EXPECT_THAT(strict_json_message(fault, "f.json"), HasSubstr("f.json:3:8: not valid JSON: "));
}

TEST(StrictJson, TextNestingTooDeeplyIsRefusedBeforeParsing) {
  EXPECT_EQ(fault_of(std::string(600, '[') + std::string(600, ']')).kind,
            JsonFault::Kind::kTooDeep);
  EXPECT_TRUE(std::holds_alternative<nlohmann::json>(
      parse_strict_json(std::string(512, '[') + std::string(512, ']'))));
}

TEST(StrictJson, ReadThrowsTheCallersKindNamingItsSource) {
  try {
    read_strict_json(R"({"x": 1, "x": 1})", ErrorKind::kCheckpoint, "m.json");
    FAIL() << "no Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kCheckpoint);
    EXPECT_THAT(error.what(), HasSubstr("m.json: x: the key appears twice in one object"));
  }
}

}  // namespace
}  // namespace zest
