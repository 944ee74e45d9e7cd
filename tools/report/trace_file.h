// A Chrome trace that zest-train wrote (log.trace, runtime/trace.h) read back into the per-rank
// overlap of communication with compute that wall_clock_breakdown prints, for zest-report.
#pragma once

#include <string>
#include <vector>

#include "runtime/trace.h"

namespace zest {

// Per rank (the trace's process ids). Throws a kData Error naming the file when it is not JSON
// or not a trace of zest's streams.
std::vector<TraceRecorder::Overlap> read_trace_overlap(const std::string& path);

}  // namespace zest
