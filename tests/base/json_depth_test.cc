#include "base/json_depth.h"

#include <string>

#include <gtest/gtest.h>

namespace zest {
namespace {

TEST(JsonDepth, CountsArraysAndObjectsOpenAtOnce) {
  EXPECT_EQ(json_nesting_depth("1"), 0u);
  EXPECT_EQ(json_nesting_depth("{}"), 1u);
  EXPECT_EQ(json_nesting_depth(R"({"a": [1, {"b": []}], "c": {}})"), 4u);
  EXPECT_EQ(json_nesting_depth("[[], [[]], []]"), 3u);
}

TEST(JsonDepth, BracketsInsideStringsDoNotCount) {
  EXPECT_EQ(json_nesting_depth(R"(["[[[{{{", "\"[[", "\\"])"), 1u);
  EXPECT_EQ(json_nesting_depth(R"({"k\"[": "]]]}}"})"), 1u);
}

TEST(JsonDepth, DeepTextIsMeasuredWithoutRecursion) {
  const std::size_t levels = 1'000'000;
  EXPECT_EQ(json_nesting_depth(std::string(levels, '[') + std::string(levels, ']')), levels);
  EXPECT_EQ(json_nesting_depth("]]]}}}[{"), 2u);  // not JSON: some bound, no underflow
}

}  // namespace
}  // namespace zest
