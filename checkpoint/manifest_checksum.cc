#include "checkpoint/manifest_checksum.h"

#include <xxhash.h>

#include "base/error.h"
#include "checkpoint/files.h"

namespace zest {
namespace {

constexpr std::string_view kChecksumLineHead = "  \"manifest_xxh3\": \"";
constexpr std::string_view kChecksumLineTail = "\"\n}\n";
constexpr std::size_t kChecksumLineBytes = kChecksumLineHead.size() + 16 + kChecksumLineTail.size();

}  // namespace

std::optional<ChecksumLine> checksum_line(std::string_view text) {
  if (text.size() < kChecksumLineBytes) return std::nullopt;
  const std::size_t body = text.size() - kChecksumLineBytes;
  const std::string_view line = text.substr(body);
  if (!line.starts_with(kChecksumLineHead) || !line.ends_with(kChecksumLineTail)) {
    return std::nullopt;
  }
  const auto recorded = parse_hex_digest(std::string(line.substr(kChecksumLineHead.size(), 16)));
  if (!recorded) return std::nullopt;
  return ChecksumLine{*recorded, XXH3_64bits(text.data(), body)};
}

std::string append_checksum_line(std::string text) {
  // dump(2) ends an object with "\n}"; the checksum line becomes its last member.
  if (!text.ends_with("\n}")) throw Error(ErrorKind::kInternal, "a manifest is not a JSON object");
  text.resize(text.size() - 2);
  text += ",\n";
  const std::string digest = hex_digest(XXH3_64bits(text.data(), text.size()));
  text += kChecksumLineHead;
  text += digest;
  text += kChecksumLineTail;
  return text;
}

}  // namespace zest
