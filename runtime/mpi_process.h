// This process's place in an MPI job. MPI is initialized once per process, on first use, and
// finalized when the process exits (a process-wide guard), so any number of Worlds and
// communicators may come and go in between. Invariant: MPI runs at MPI_THREAD_MULTIPLE — every
// stream is a worker thread that calls MPI — or this fails at initialization, naming the level
// the library gave. Built only with MPI (ZEST_HAVE_MPI); this header does not include <mpi.h>.
#pragma once

namespace zest {

class MpiProcess {
 public:
  // Initializes MPI on the first call (or adopts an MPI the program initialized itself, which
  // the program then also finalizes). Throws a kDevice Error if MPI cannot run at
  // MPI_THREAD_MULTIPLE.
  static MpiProcess& get();

  int rank() const { return rank_; }  // in MPI_COMM_WORLD
  int size() const { return size_; }

  // Ends every process of the job with `status` (MPI_Abort on MPI_COMM_WORLD); used when a rank
  // fails, so that its peers never wait for it. Does not return.
  [[noreturn]] void abort(int status) const;

  MpiProcess(const MpiProcess&) = delete;
  MpiProcess& operator=(const MpiProcess&) = delete;

 private:
  MpiProcess();
  ~MpiProcess();  // MPI_Finalize, where this guard initialized MPI

  int rank_ = 0;
  int size_ = 1;
  bool finalize_at_exit_ = false;
};

}  // namespace zest
