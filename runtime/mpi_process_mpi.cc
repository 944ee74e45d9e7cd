#include "runtime/mpi_process.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "runtime/mpi_check.h"

namespace zest {

namespace mpi {

std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return "MPI error code " + std::to_string(code);
  }
  return std::string(text, static_cast<std::size_t>(length));
}

void check(int code, const char* what, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  int error_class = code;
  MPI_Error_class(code, &error_class);
  ErrorKind kind = ErrorKind::kDevice;
#if defined(MPIX_ERR_PROC_FAILED)
  if (error_class == MPIX_ERR_PROC_FAILED) kind = ErrorKind::kPeerFailure;
#endif
#if defined(MPI_ERR_PROC_FAILED)
  if (error_class == MPI_ERR_PROC_FAILED) kind = ErrorKind::kPeerFailure;
#endif
  throw Error(kind, std::string(what) + " failed (" + file + ":" + std::to_string(line) +
                        "): " + error_text(code));
}

}  // namespace mpi

namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

[[noreturn]] void insufficient_thread_level(int provided, bool finalize) {
  // Note: finalized here, not left to the exit, so that every process of the job ends cleanly
  // with the same error instead of the launcher reporting a process that skipped MPI_Finalize.
  if (finalize) MPI_Finalize();
  throw Error(ErrorKind::kDevice,
              std::string("MPI provides ") + thread_level_name(provided) +
                  ", but zest needs MPI_THREAD_MULTIPLE (its streams are threads that each call "
                  "MPI); use an MPI built with thread support (Open MPI: "
                  "--enable-mpi-thread-multiple, the default since 3.0)");
}

}  // namespace

MpiProcess::MpiProcess() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    // The program initialized MPI itself: it keeps ownership, and must have asked for threads.
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE) insufficient_thread_level(provided, false);
  } else {
    const int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (code != MPI_SUCCESS) {
      throw Error(ErrorKind::kDevice, "MPI_Init_thread failed: " + mpi::error_text(code));
    }
    if (provided < MPI_THREAD_MULTIPLE) insufficient_thread_level(provided, true);
    finalize_at_exit_ = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiProcess::~MpiProcess() {
  if (!finalize_at_exit_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

MpiProcess& MpiProcess::get() {
  // Note: a function-local static is the process-wide guard: initialized once (thread-safe),
  // destroyed at exit after every World and communicator, which live in main's scope, are gone.
  static MpiProcess process;
  return process;
}

void MpiProcess::abort(int status) const {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, status);
  std::_Exit(status);  // MPI_Abort does not return; this only satisfies [[noreturn]]
}

}  // namespace zest
