// Fuzzes the token readers of data/token_data.h on bytes in memory, as load_token_shards and
// load_text_tokens see a file's contents: an llm.c `.bin` shard (header, count, tokens below the
// vocabulary) and a text file read as bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "base/error.h"
#include "data/token_data.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

constexpr std::int64_t kVocabulary = 50257;  // GPT-2's; tokens at or above it are refused

void fuzz_shard(std::string_view bytes) {
  zest::TokenData data;
  try {
    zest::append_token_shard(bytes, "fuzz.bin", kVocabulary, data);
  } catch (const zest::Error&) {
    zest::fuzz::check(data.tokens.empty() && data.files.empty(), "a refused shard left tokens");
    return;
  }
  // Accepted: exactly the tokens after the 1024-byte header, each below the vocabulary.
  const std::size_t header = zest::kTokenShardHeaderInts * sizeof(std::int32_t);
  zest::fuzz::check(bytes.size() == header + 2 * data.tokens.size(), "token count");
  zest::fuzz::check(data.tokens.empty() || std::memcmp(bytes.data() + header, data.tokens.data(),
                                                       2 * data.tokens.size()) == 0,
                    "tokens differ from the file's");
  for (std::uint16_t token : data.tokens) zest::fuzz::check(token < kVocabulary, "vocabulary");
}

void fuzz_text(std::string_view bytes) {
  try {
    const zest::TokenData data = zest::text_tokens(bytes, "fuzz.txt");
    zest::fuzz::check(data.tokens.size() == bytes.size(), "one token per byte");
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      zest::fuzz::check(data.tokens[i] == static_cast<unsigned char>(bytes[i]), "byte value");
    }
  } catch (const zest::Error&) {
    zest::fuzz::check(bytes.empty(), "a non-empty text was refused");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes = zest::fuzz::bytes_of(data, size);
  fuzz_shard(bytes);
  fuzz_text(bytes);
  return 0;
}
