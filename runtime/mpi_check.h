// Turns the return code of an MPI call into a zest Error naming the call, where it was made and
// MPI's own text for the code. Private to the MPI backend: only *_mpi.cc files include it, since
// it includes <mpi.h>, which no public header may.
#pragma once

#include <mpi.h>

#include <string>

namespace zest::mpi {

// Throws an Error for a code other than MPI_SUCCESS: kPeerFailure where MPI reports a failed
// process (only MPIs with fault tolerance do), kDevice otherwise. `what` names the call.
void check(int code, const char* what, const char* file, int line);

// MPI_Error_string of `code`, or the number where MPI has no text for it.
std::string error_text(int code);

}  // namespace zest::mpi

// Checks an MPI call on a communicator with MPI_ERRORS_RETURN; records file and line.
#define ZEST_MPI_CHECK(call) ::zest::mpi::check((call), #call, __FILE__, __LINE__)
