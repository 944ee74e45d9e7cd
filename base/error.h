// The one error type of zest. Every failure carries a kind (what sort of thing went wrong)
// and a where (a JSON path, a file and offset, a rank and a collective) so that the message a
// user finally sees says what, where and what to do. Tools map kinds to exit codes: input
// kinds (config, data, checkpoint, usage) exit 2, run-time kinds exit 1.
#pragma once

#include <stdexcept>
#include <string>

namespace zest {

enum class ErrorKind {
  kConfig,         // a config key, type or value is not allowed
  kData,           // a data file is missing, malformed or out of range
  kUsage,          // a command line or API call is used wrongly
  kCheckpoint,     // a checkpoint is missing, corrupt or does not fit this run
  kOutOfMemory,    // an allocation would exceed a device's capacity
  kCommTimeout,    // a collective waited past its timeout for a peer
  kPeerFailure,    // another rank failed, so this collective cannot complete
  kCommMismatch,   // ranks called different collectives, counts or dtypes
  kDevice,         // a CUDA / NCCL / MPI call failed
  kIo,             // the OS could not read or write a file (disk full, permissions, I/O error)
  kDivergence,     // training produced non-finite values (a NaN or inf gradient, fp32 / bf16)
  kInternal,       // a broken invariant inside zest
};

const char* error_kind_name(ErrorKind kind);

// True for kinds caused by the user's input (exit status 2 in tools); false for failures at
// run time (exit status 1).
bool is_input_error(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message);

  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// A distinct type so that callers can catch an out-of-memory on its own and retry smaller.
class OutOfMemory : public Error {
 public:
  explicit OutOfMemory(std::string message) : Error(ErrorKind::kOutOfMemory, std::move(message)) {}
};

// Returns `error` with `context` put in front ("rank 2: ...") and the same kind; a non-zest
// exception becomes kInternal.
Error with_context(const std::exception& error, const std::string& context);

// Throws `error` as its most specific type (OutOfMemory for that kind), so that an error carried
// across a thread keeps the type a caller may catch.
[[noreturn]] void raise(const Error& error);

}  // namespace zest
