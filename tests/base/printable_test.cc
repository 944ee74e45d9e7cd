#include "base/printable.h"

#include <string>

#include <gtest/gtest.h>

namespace zest {
namespace {

using namespace std::string_literals;

TEST(Printable, OrdinaryTextPassesUnchanged) {
  EXPECT_EQ(printable("layer0.weight: shape [31, 13]"), "layer0.weight: shape [31, 13]");
  EXPECT_EQ(printable("world_size × shard_alignment, naïve, 日本, 🙂"),
            "world_size × shard_alignment, naïve, 日本, 🙂");
}

TEST(Printable, ControlCharactersAreEscaped) {
  EXPECT_EQ(printable("step-40\0junk"s), "step-40\\x00junk");
  EXPECT_EQ(printable("\x1b[31mred\x1b[0m\x07\x7f"), "\\x1b[31mred\\x1b[0m\\x07\\x7f");
  EXPECT_EQ(printable("two\nlines\r"), "two\\x0alines\\x0d");
  // C1 controls: CSI as one byte (not UTF-8) and as UTF-8 U+009B.
  EXPECT_EQ(printable("a\x9b" "b"), "a\\x9bb");
  EXPECT_EQ(printable("a\xc2\x9b" "b"), "a\\xc2\\x9bb");
}

TEST(Printable, InvalidUtf8IsEscapedBytewise) {
  EXPECT_EQ(printable("\xc3"), "\\xc3");                  // cut short
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");         // overlong '/'
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // past U+10FFFF
  EXPECT_EQ(printable("\xff\xfe"), "\\xff\\xfe");
}

TEST(QuotedText, ShowsExactlyWhatAFileHeld) {
  EXPECT_EQ(quoted_text("step-2\n"), "\"step-2\\n\"");
  EXPECT_EQ(quoted_text("step-40\0junk"s), "\"step-40\\x00junk\"");
  EXPECT_EQ(quoted_text("a \"b\" \\c\r\t"), "\"a \\\"b\\\" \\\\c\\r\\t\"");
  EXPECT_EQ(quoted_text(""), "\"\"");
}

TEST(QuotedText, LongTextIsCutAndItsLengthSaid) {
  EXPECT_EQ(quoted_text(std::string(4096, 's'), 8), "\"ssssssss\"... (4096 bytes)");
  EXPECT_EQ(quoted_text("12345678", 8), "\"12345678\"");
}

TEST(QuotedPath, ALongPathIsCutAndItsLengthSaid) {
  EXPECT_EQ(quoted_path("/data/train_*.bin"), "'/data/train_*.bin'");
  const std::string message = quoted_path(std::string(5000, 'p'));
  EXPECT_EQ(message, "'" + std::string(kPathShown, 'p') + "'... (5000 bytes)");
}

TEST(FirstInvalidUtf8, FindsTheFirstByteThatIsNotUtf8) {
  EXPECT_EQ(first_invalid_utf8("shards/train_日本_🙂.bin"), std::nullopt);
  EXPECT_EQ(first_invalid_utf8(""), std::nullopt);
  // Control characters are valid UTF-8 (a JSON string escapes them); only bad bytes are found.
  EXPECT_EQ(first_invalid_utf8("a\tb\x7f"), std::nullopt);
  EXPECT_EQ(first_invalid_utf8("data/\xff.bin"), std::optional<std::size_t>(5));
  EXPECT_EQ(first_invalid_utf8("ab\xc3"), std::optional<std::size_t>(2));          // cut short
  EXPECT_EQ(first_invalid_utf8("\xc0\xaf"), std::optional<std::size_t>(0));        // overlong
  EXPECT_EQ(first_invalid_utf8("x\xed\xa0\x80"), std::optional<std::size_t>(1));  // surrogate
}

}  // namespace
}  // namespace zest
