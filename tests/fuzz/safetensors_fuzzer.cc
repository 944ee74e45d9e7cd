// Fuzzes the safetensors reader (checkpoint/safetensors.h) on whole files: the 8-byte header length,
// the JSON header, then every tensor's bytes read back. An accepted file's tensors tile its data
// section exactly, which is the reader's invariant.
#include <cstddef>
#include <cstdint>

#include "base/error.h"
#include "checkpoint/safetensors.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static zest::fuzz::ScratchFile file("model.safetensors");
  const std::string& path = file.write(zest::fuzz::bytes_of(data, size));
  try {
    const zest::SafetensorsReader reader(path);
    std::uint64_t next = 0;
    for (const zest::SafetensorsTensor& tensor : reader.tensors()) {
      zest::fuzz::check(tensor.begin == next, "tensors do not tile the data");
      next = tensor.end;
      const std::size_t bytes = reader.read_bytes(tensor).size();
      zest::fuzz::check(bytes == tensor.end - tensor.begin, "read_bytes length");
      if (zest::dtype_from_safetensors(tensor.dtype)) {
        try {
          zest::fuzz::check(reader.read_float32(tensor.name).size() == tensor.numel(),
                            "read_float32 length");
        } catch (const zest::Error&) {  // I32 is not a floating-point type
        }
      }
    }
  } catch (const zest::Error&) {
  }
  return 0;
}
