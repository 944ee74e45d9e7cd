#include "base/byte_size.h"

#include <cstddef>
#include <limits>

#include <gtest/gtest.h>

namespace zest {
namespace {

TEST(ByteSize, PlainIntegersAreBytes) {
  EXPECT_EQ(parse_byte_size("0"), std::size_t{0});
  EXPECT_EQ(parse_byte_size("1048576"), std::size_t{1048576});
  EXPECT_EQ(parse_byte_size("17B"), std::size_t{17});
}

TEST(ByteSize, BinaryUnitsArePowersOf1024) {
  EXPECT_EQ(parse_byte_size("2GiB"), std::size_t{2} << 30);
  EXPECT_EQ(parse_byte_size("512MiB"), std::size_t{512} << 20);
  EXPECT_EQ(parse_byte_size("4 KiB"), std::size_t{4096});
  EXPECT_EQ(parse_byte_size("1TiB"), std::size_t{1} << 40);
  EXPECT_EQ(parse_byte_size("0.5KiB"), std::size_t{512});
}

TEST(ByteSize, DecimalUnitsArePowersOf1000) {
  EXPECT_EQ(parse_byte_size("1.5GB"), std::size_t{1500000000});
  EXPECT_EQ(parse_byte_size("3kB"), std::size_t{3000});
  EXPECT_EQ(parse_byte_size("2MB"), std::size_t{2000000});
  EXPECT_EQ(parse_byte_size("1.000TB"), std::size_t{1000000000000});
}

TEST(ByteSize, UnitsAreCaseInsensitive) {
  EXPECT_EQ(parse_byte_size("2gib"), std::size_t{2} << 30);
  EXPECT_EQ(parse_byte_size("2GIB"), std::size_t{2} << 30);
}

TEST(ByteSize, RejectsMalformedSizes) {
  for (const char* text : {"", "GiB", "-1", "-1GiB", "1.5", "1.5B", "2 GiB ", " 2GiB", "2  GiB",
                           "2XB", "2GiBs", "1e9", "0x10", "1..5GB", "."}) {
    EXPECT_FALSE(parse_byte_size(text).has_value()) << text;
  }
}

TEST(ByteSize, RejectsSizesPastSizeT) {
  EXPECT_EQ(parse_byte_size("18446744073709551615"), std::numeric_limits<std::size_t>::max());
  EXPECT_FALSE(parse_byte_size("18446744073709551616").has_value());
  EXPECT_FALSE(parse_byte_size("16777216TiB").has_value());  // 2^64
  EXPECT_FALSE(parse_byte_size("99999999999999999999999999999999GiB").has_value());
  EXPECT_FALSE(parse_byte_size("0.0000000000000000000000000000000000000001KiB").has_value());
}

TEST(FormatBytes, UsesBinaryUnits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(3 * std::size_t{1024 * 1024} / 2), "1.50 MiB");
  EXPECT_EQ(format_bytes(std::size_t{2} << 30), "2.00 GiB");
}

}  // namespace
}  // namespace zest
