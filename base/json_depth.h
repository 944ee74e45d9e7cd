// How deeply a JSON text nests, measured before it is parsed. nlohmann parses any depth without
// recursion, but copies and prints a value recursively, so a file of a few hundred kilobytes of
// '[' overflows the stack wherever the parsed value is later copied or dumped. Readers of files
// (the trainer's config, a checkpoint manifest) refuse text deeper than kMaxJsonDepth first.
#pragma once

#include <cstddef>
#include <string_view>

namespace zest {

// Far deeper than any config or manifest zest writes (about 5), far shallower than a stack runs
// out at (tens of thousands of levels).
inline constexpr std::size_t kMaxJsonDepth = 512;

// The largest number of arrays and objects open at once in `text`, counting brackets outside
// strings; for text that is not JSON, some number that parsing will not exceed.
std::size_t json_nesting_depth(std::string_view text);

}  // namespace zest
