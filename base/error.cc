#include "base/error.h"

#include <utility>

namespace zest {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kConfig: return "config";
    case ErrorKind::kData: return "data";
    case ErrorKind::kUsage: return "usage";
    case ErrorKind::kCheckpoint: return "checkpoint";
    case ErrorKind::kOutOfMemory: return "out of memory";
    case ErrorKind::kCommTimeout: return "communication timeout";
    case ErrorKind::kPeerFailure: return "peer failure";
    case ErrorKind::kCommMismatch: return "collective mismatch";
    case ErrorKind::kDevice: return "device";
    case ErrorKind::kIo: return "i/o";
    case ErrorKind::kDivergence: return "divergence";
    case ErrorKind::kInternal: return "internal";
  }
  return "unknown";
}

bool is_input_error(ErrorKind kind) {
  return kind == ErrorKind::kConfig || kind == ErrorKind::kData || kind == ErrorKind::kUsage ||
         kind == ErrorKind::kCheckpoint;
}

Error::Error(ErrorKind kind, std::string message)
    : std::runtime_error(std::move(message)), kind_(kind) {}

Error with_context(const std::exception& error, const std::string& context) {
  const auto* zest_error = dynamic_cast<const Error*>(&error);
  ErrorKind kind = zest_error ? zest_error->kind() : ErrorKind::kInternal;
  return Error(kind, context + ": " + error.what());
}

void raise(const Error& error) {
  if (error.kind() == ErrorKind::kOutOfMemory) throw OutOfMemory(error.what());
  throw error;
}

}  // namespace zest
