// Shared by the fuzzers (tests/fuzz/*_fuzzer.cc, built by cmake/ZestFuzz.cmake). The rule they
// enforce: a reader given any bytes either succeeds or throws zest::Error, the clear message the
// input deserves. Anything else (another exception, a sanitizer report, a huge allocation, a
// hang) escapes LLVMFuzzerTestOneInput and libFuzzer reports it as a crash.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace zest::fuzz {

inline std::string_view bytes_of(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Violations of a reader's promises that are not exceptions: fail loudly so libFuzzer keeps the
// input (abort counts as a crash).
inline void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "fuzz check failed: %s\n", what);
    std::abort();
  }
}

// A file for readers that take a path, in a directory of its own per process (libFuzzer's
// -fork/-jobs run several), rewritten for each input and removed at exit.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& name)
      : dir_(std::filesystem::temp_directory_path() /
             ("zest_fuzz_" + std::to_string(::getpid()))),
        path_((dir_ / name).string()) {
    std::filesystem::create_directories(dir_);
  }
  ~ScratchFile() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::string dir() const { return dir_.string(); }
  const std::string& write(std::string_view bytes) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    check(static_cast<bool>(out), "cannot write the scratch file");
    return path_;
  }

 private:
  std::filesystem::path dir_;
  std::string path_;
};

}  // namespace zest::fuzz
