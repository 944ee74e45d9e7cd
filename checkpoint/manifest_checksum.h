// manifest.json's own checksum (internal to checkpoint/): the manifest declares near its top that
// it carries one (kChecksumKey: kChecksumRule), and its last line holds the XXH3-64 of every byte
// before that line. Written by manifest_text, checked by parse_manifest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace zest {

inline constexpr const char* kChecksumKey = "checksum";
inline constexpr const char* kChecksumRule =
    "xxh3-64 of the bytes before the last line, which holds it as manifest_xxh3";

struct ChecksumLine {
  std::uint64_t recorded = 0;  // what the line says
  std::uint64_t actual = 0;    // what the bytes before it hash to
};

// The checksum line `text` ends with, exactly as append_checksum_line writes it; nothing
// otherwise.
std::optional<ChecksumLine> checksum_line(std::string_view text);

// `json_text`, a JSON object as dump(2) writes it, with the checksum line as its last member.
std::string append_checksum_line(std::string json_text);

}  // namespace zest
