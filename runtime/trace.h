// A timeline of what each rank's streams ran: one slice per collective and per unit's forward
// or backward, written as Chrome Trace Event Format JSON (one process per rank, one track per
// stream) that Perfetto and chrome://tracing load. Thread-safe: every stream of every rank adds
// to one recorder. Recording costs two clock reads and a locked push per slice.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace zest {

class TraceRecorder {
 public:
  struct Slice {
    int rank = 0;
    std::string track;  // the stream's role: "compute", "comm", "prefetch", "checkpoints", or
                        // "comm inter-node" (the link model's waits, runtime/link_model.h)
    std::string name;
    std::int64_t begin_us = 0;
    std::int64_t end_us = 0;
    std::int64_t bytes = -1;  // moved by a collective; -1 when not a collective
    // CPU time the stream's thread spent inside the slice (thread_cpu_us), for slices whose
    // work runs on that thread: below the wall time when the thread waited or was descheduled
    // (more ranks than cores). -1 when not recorded.
    std::int64_t cpu_us = -1;
  };

  // Per rank: time busy computing, time busy communicating (comm and prefetch streams, their
  // union), and how much of the communicating time had compute running at the same moment.
  struct Overlap {
    double compute_ms = 0.0;
    double comm_ms = 0.0;
    double hidden_fraction = 0.0;  // of comm time, under compute
  };

  // Microseconds on a steady clock shared by every recorder in the process.
  static std::int64_t now_us();
  // Microseconds of CPU time the calling thread has used (CLOCK_THREAD_CPUTIME_ID).
  static std::int64_t thread_cpu_us();

  void add(Slice slice);
  std::vector<Slice> slices() const;

  // Writes the trace atomically (temporary file, then rename). Throws a kData Error naming the
  // file when it cannot be written.
  void write(const std::string& path) const;
  std::vector<Overlap> overlap(int ranks) const;

 private:
  mutable std::mutex mutex_;
  std::vector<Slice> slices_;
};

// The role of a stream from its name ("rank 2 comm" → "comm").
std::string stream_role(const std::string& stream_name);

}  // namespace zest
