#include "tools/report/trace_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "base/error.h"
#include "base/file_checks.h"
#include "base/printable.h"
#include "base/strict_json.h"

namespace zest {
namespace {

using nlohmann::json;

// Ranks beyond this are not a zest trace's process ids (one per rank) but some other file's.
constexpr std::int64_t kMaxRanks = 65536;

[[noreturn]] void not_a_trace(const std::string& path, const std::string& why) {
  throw Error(ErrorKind::kData, "'" + printable(path) + "' is not a trace zest-train wrote (" +
                                    why + "); give the file log.trace names");
}

std::int64_t integer_field(const json& event, const char* key, const std::string& path) {
  const auto it = event.find(key);
  if (it == event.end() || !it->is_number_integer()) {
    not_a_trace(path, std::string("an event without an integer \"") + key + "\"");
  }
  return it->get<std::int64_t>();
}

// A string field, or "" when absent or not a string.
std::string text_field(const json& event, const char* key) {
  const auto it = event.find(key);
  return it != event.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

std::vector<TraceRecorder::Overlap> read_trace_overlap(const std::string& path) {
  refuse_non_regular_file(path, ErrorKind::kData, "--trace");
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw Error(ErrorKind::kData,
                "cannot read trace '" + printable(path) + "' (" + std::strerror(errno) + ")");
  }
  std::ostringstream buffer;
  buffer << file.rdbuf();
  const json trace = read_strict_json(buffer.str(), ErrorKind::kData, printable(path));
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array()) {
    not_a_trace(path, "no \"traceEvents\" array");
  }
  // Track names come from the thread_name metadata zest writes for each (rank, stream).
  std::map<std::pair<std::int64_t, std::int64_t>, std::string> tracks;
  for (const json& event : trace["traceEvents"]) {
    if (!event.is_object()) not_a_trace(path, "an event that is not an object");
    if (text_field(event, "ph") != "M" || text_field(event, "name") != "thread_name") continue;
    const auto args = event.find("args");
    if (args == event.end() || !args->is_object() || !args->contains("name") ||
        !(*args)["name"].is_string()) {
      not_a_trace(path, "a thread_name without its name");
    }
    tracks[{integer_field(event, "pid", path), integer_field(event, "tid", path)}] =
        (*args)["name"].get<std::string>();
  }
  TraceRecorder recorder;
  std::int64_t ranks = 0;
  for (const json& event : trace["traceEvents"]) {
    if (text_field(event, "ph") != "X") continue;
    const std::int64_t rank = integer_field(event, "pid", path);
    if (rank < 0 || rank >= kMaxRanks) not_a_trace(path, "a process id that is not a rank");
    const auto track = tracks.find({rank, integer_field(event, "tid", path)});
    if (track == tracks.end()) not_a_trace(path, "a slice on a stream it does not name");
    const std::int64_t begin = integer_field(event, "ts", path);
    const std::int64_t duration = integer_field(event, "dur", path);
    if (duration < 0) not_a_trace(path, "a slice of negative duration");
    recorder.add({static_cast<int>(rank), track->second, "", begin, begin + duration, -1});
    ranks = std::max(ranks, rank + 1);
  }
  if (ranks == 0) not_a_trace(path, "no slices");
  return recorder.overlap(static_cast<int>(ranks));
}

}  // namespace zest
