// Token streams read from disk: llm.c's `.bin` shards (a 256 × int32 header — magic 20240520,
// version 1, token count — then uint16 tokens) or a plain text file read as bytes (vocabulary
// 256). Every check happens at load, so a bad file is one clear error before training starts,
// never a crash in the middle of it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zest {

inline constexpr std::int32_t kTokenShardMagic = 20240520;
inline constexpr std::int32_t kTokenShardVersion = 1;
inline constexpr std::size_t kTokenShardHeaderInts = 256;

struct TokenData {
  std::vector<std::uint16_t> tokens;  // the shards' tokens end to end, in file-name order
  std::vector<std::string> files;
};

// `pattern` is a file or a glob ("data/fineweb_train_*.bin"). Checks each file's header (magic,
// version), that its size is exactly header + count × 2 bytes, and that every token is below
// `vocab_size`. Throws a kData Error naming the file, the offset and what is expected; `key` (the
// config key that gave the path) names a pattern that matches nothing or a file that is not a
// regular file, which is refused before it is opened.
TokenData load_token_shards(const std::string& pattern, std::int64_t vocab_size,
                            const std::string& key = "data.path");

// A text file as byte tokens (0..255). An empty, missing or not regular file is a kData Error.
TokenData load_text_tokens(const std::string& path, const std::string& key = "data.path");

// The same two readers for bytes already in memory (the file readers call them; so do the
// fuzzers, tests/fuzz/): `source` names the bytes in errors. append_token_shard adds one
// shard's tokens and `source` to `data`.
void append_token_shard(std::string_view bytes, const std::string& source,
                        std::int64_t vocab_size, TokenData& data);
TokenData text_tokens(std::string_view bytes, const std::string& source);

// Writes `tokens` as one llm.c shard (used by tests and to prepare data). Throws kData on an
// I/O failure; the file appears whole or not at all (written to a temporary, then renamed).
void write_token_shard(const std::string& path, const std::vector<std::uint16_t>& tokens);

}  // namespace zest
