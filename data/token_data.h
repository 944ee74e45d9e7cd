// Token streams read from disk: llm.c's `.bin` shards (a 256 × int32 header — magic 20240520,
// version 1, token count — then uint16 tokens) or a plain text file read as bytes (vocabulary
// 256). Every check happens at load, so a bad file is one clear error before training starts,
// never a crash in the middle of it.
#pragma once

#include <cstdint>
#include <string>
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
// `vocab_size`. Throws a kData Error naming the file, the offset and what is expected.
TokenData load_token_shards(const std::string& pattern, std::int64_t vocab_size);

// A text file as byte tokens (0..255). An empty or missing file is a kData Error.
TokenData load_text_tokens(const std::string& path);

// Writes `tokens` as one llm.c shard (used by tests and to prepare data). Throws kData on an
// I/O failure; the file appears whole or not at all (written to a temporary, then renamed).
void write_token_shard(const std::string& path, const std::vector<std::uint16_t>& tokens);

}  // namespace zest
