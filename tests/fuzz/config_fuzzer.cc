// Fuzzes the trainer's config loader, zest::load_resolved_config, on a config file holding the
// input: JSON text (or not: then file:line:column) -> a validated TrainConfig. A config is
// accepted, or refused with a zest::Error; an accepted one's resolved JSON must load again to
// the same resolved JSON (what --print-config shows and manifests record).
#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "tests/fuzz/fuzz_support.h"
#include "resolve/resolved_config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static zest::fuzz::ScratchFile file("config.json");
  const std::string& path = file.write(zest::fuzz::bytes_of(data, size));
  try {
    const zest::TrainConfig parsed = zest::load_resolved_config(path);
    const zest::TrainConfig again = zest::parse_resolved_config(parsed.json);
    zest::fuzz::check(again.json == parsed.json, "the resolved config does not load to itself");
  } catch (const zest::Error&) {
  }
  return 0;
}
