// The bytes of one rank's swap files under an NVMe folder, as the file system reports them: what
// the tests hold against the trainer's swap_bytes() and the planner's NVMe tier.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

namespace zest::testing {

inline std::size_t swap_file_bytes(const std::string& folder, int rank) {
  std::size_t bytes = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(folder)) {
    if (entry.is_regular_file() && entry.path().filename().string().rfind("swap.", 0) == 0 &&
        entry.path().string().find("rank" + std::to_string(rank)) != std::string::npos) {
      bytes += entry.file_size();
    }
  }
  return bytes;
}

}  // namespace zest::testing
