#include "base/byte_size.h"

#include <cctype>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <string>

namespace zest {

namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Bytes per unit, or 0 for an unknown unit.
std::uint64_t unit_bytes(std::string_view unit) {
  const std::string name = lower(unit);
  if (name.empty() || name == "b") return 1;
  if (name == "kb") return 1000ull;
  if (name == "mb") return 1000ull * 1000;
  if (name == "gb") return 1000ull * 1000 * 1000;
  if (name == "tb") return 1000ull * 1000 * 1000 * 1000;
  if (name == "kib") return 1ull << 10;
  if (name == "mib") return 1ull << 20;
  if (name == "gib") return 1ull << 30;
  if (name == "tib") return 1ull << 40;
  return 0;
}

}  // namespace

std::optional<std::size_t> parse_byte_size(std::string_view text) {
  // Note: the number is kept as an exact decimal (integer digits, fraction digits) rather than a
  // double, so that "1.5GB" is exactly 1500000000 and a size near 2^64 does not round.
  std::size_t i = 0;
  std::string whole;
  std::string fraction;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) whole += text[i++];
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      fraction += text[i++];
    }
  }
  if (whole.empty() && fraction.empty()) return std::nullopt;
  if (i < text.size() && text[i] == ' ') ++i;
  const std::uint64_t scale = unit_bytes(text.substr(i));
  if (scale == 0) return std::nullopt;
  // Trailing zeros of the fraction do not change the value.
  while (!fraction.empty() && fraction.back() == '0') fraction.pop_back();

  constexpr std::uint64_t kMax = std::numeric_limits<std::size_t>::max();
  // value = (whole + fraction / 10^f) × scale = (whole × 10^f + fraction) × scale / 10^f.
  // Note: the numerator is capped at 2^86 and a unit is at most 2^41 bytes, so the product
  // fits 128 bits; anything that large is far past kMax bytes for every unit anyway.
  constexpr unsigned __int128 kNumeratorCap = static_cast<unsigned __int128>(1) << 86;
  unsigned __int128 numerator = 0;
  unsigned __int128 denominator = 1;
  for (char c : whole + fraction) {
    numerator = numerator * 10 + static_cast<unsigned>(c - '0');
    if (numerator > kNumeratorCap) return std::nullopt;
  }
  if (fraction.size() > 30) return std::nullopt;  // keeps 10^f within 128 bits
  for (std::size_t k = 0; k < fraction.size(); ++k) denominator *= 10;
  const unsigned __int128 scaled = numerator * scale;
  if (scaled % denominator != 0) return std::nullopt;  // not a whole number of bytes
  const unsigned __int128 bytes = scaled / denominator;
  if (bytes > kMax) return std::nullopt;
  return static_cast<std::size_t>(bytes);
}

std::string format_bytes(std::size_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof(text), "%zu B", bytes);
  } else {
    std::snprintf(text, sizeof(text), "%.2f %s", value, kUnits[unit]);
  }
  return text;
}


}  // namespace zest
