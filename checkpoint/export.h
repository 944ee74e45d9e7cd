// Consolidating a checkpoint's shards into the full parameters, by the model's parameter names
// ("<unit>.<name>", flat order), as one safetensors file (checkpoint/safetensors.h). The values
// come from the fp32 master weights when the checkpoint has them (2-byte training), else from the
// parameters, converted to the dtype asked for with round to nearest even — so a bf16 export of
// a bf16 run holds exactly the run's parameters. A tensor-parallel run's parameters are put back
// together whole, so the file is the same at every tensor-parallel size. Invariant: the file
// appears whole or not at all, and the source's checksums are verified before it is read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/dtype.h"

namespace zest {

struct ExportResult {
  std::string path;
  std::size_t tensors = 0;
  std::uint64_t parameters = 0;  // elements
  std::string taken_from;        // "master" or "params"
};

// `source`: a checkpoint directory or a root with `latest`; `dtype`: fp32, bf16 or fp16.
ExportResult export_safetensors(const std::string& source, const std::string& out, DType dtype);

}  // namespace zest
