#include "runtime/trace.h"

#include <algorithm>
#include <map>

#include <time.h>

#include <nlohmann/json.hpp>

#include "base/durable_file.h"
#include "base/error.h"

namespace zest {

namespace {

using Interval = std::pair<std::int64_t, std::int64_t>;

// Sorts and merges overlapping intervals.
std::vector<Interval> merged(std::vector<Interval> intervals) {
  std::sort(intervals.begin(), intervals.end());
  std::vector<Interval> result;
  for (const Interval& interval : intervals) {
    if (!result.empty() && interval.first <= result.back().second) {
      result.back().second = std::max(result.back().second, interval.second);
    } else {
      result.push_back(interval);
    }
  }
  return result;
}

std::int64_t total(const std::vector<Interval>& intervals) {
  std::int64_t sum = 0;
  for (const auto& [begin, end] : intervals) sum += end - begin;
  return sum;
}

// Length of the intersection of two merged interval lists.
std::int64_t intersection(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::int64_t sum = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const std::int64_t begin = std::max(a[i].first, b[j].first);
    const std::int64_t end = std::min(a[i].second, b[j].second);
    if (begin < end) sum += end - begin;
    (a[i].second < b[j].second) ? ++i : ++j;
  }
  return sum;
}

int track_id(const std::string& track) {
  if (track == "compute") return 0;
  if (track == "comm") return 1;
  if (track == "prefetch") return 2;
  if (track == "comm inter-node") return 4;  // the link model's waits (link_model.h)
  if (track == "prefetch inter-node") return 5;
  if (track == "nvme") return 6;  // the NVMe tier's reads and writes (runtime/swap_copies.h)
  return 3;
}

}  // namespace

std::int64_t TraceRecorder::now_us() {
  using namespace std::chrono;
  return duration_cast<microseconds>(steady_clock::now().time_since_epoch()).count();
}

std::int64_t TraceRecorder::thread_cpu_us() {
  timespec time{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time);
  return static_cast<std::int64_t>(time.tv_sec) * 1000000 + time.tv_nsec / 1000;
}

void TraceRecorder::add(Slice slice) {
  std::lock_guard lock(mutex_);
  slices_.push_back(std::move(slice));
}

std::vector<TraceRecorder::Slice> TraceRecorder::slices() const {
  std::lock_guard lock(mutex_);
  return slices_;
}

void TraceRecorder::write(const std::string& path) const {
  const std::vector<Slice> all = slices();
  std::int64_t origin = all.empty() ? 0 : all.front().begin_us;
  for (const Slice& slice : all) origin = std::min(origin, slice.begin_us);
  nlohmann::json events = nlohmann::json::array();
  std::map<std::pair<int, std::string>, bool> named;
  for (const Slice& slice : all) {
    const int tid = track_id(slice.track);
    if (!named[{slice.rank, slice.track}]) {
      named[{slice.rank, slice.track}] = true;
      events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", slice.rank}, {"tid", tid},
                        {"args", {{"name", "rank " + std::to_string(slice.rank)}}}});
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", slice.rank}, {"tid", tid},
                        {"args", {{"name", slice.track}}}});
    }
    nlohmann::json event = {{"ph", "X"},  {"name", slice.name}, {"pid", slice.rank},
                            {"tid", tid}, {"ts", slice.begin_us - origin},
                            {"dur", slice.end_us - slice.begin_us}};
    event["cat"] = slice.bytes >= 0 ? "collective" : "compute";
    if (slice.bytes >= 0) event["args"] = {{"bytes", slice.bytes}};
    if (slice.cpu_us >= 0) event["args"]["cpu_us"] = slice.cpu_us;
    events.push_back(std::move(event));
  }
  const nlohmann::json trace = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  write_file_durably(path, trace.dump() + "\n");
}

std::vector<TraceRecorder::Overlap> TraceRecorder::overlap(int ranks) const {
  std::vector<std::vector<Interval>> compute(ranks), comm(ranks);
  for (const Slice& slice : slices()) {
    if (slice.rank < 0 || slice.rank >= ranks) continue;
    // Checkpoint copies (activation_checkpointing.cpu_checkpointing) and the NVMe tier's reads
    // and writes move no gradient or parameter: they are not communication.
    if (slice.track == "checkpoints" || slice.track == "nvme") continue;
    auto& list = slice.track == "compute" ? compute[slice.rank] : comm[slice.rank];
    list.push_back({slice.begin_us, slice.end_us});
  }
  std::vector<Overlap> result(ranks);
  for (int rank = 0; rank < ranks; ++rank) {
    const auto busy = merged(compute[rank]);
    const auto moving = merged(comm[rank]);
    const std::int64_t comm_us = total(moving);
    result[rank].compute_ms = total(busy) / 1000.0;
    result[rank].comm_ms = comm_us / 1000.0;
    result[rank].hidden_fraction =
        comm_us > 0 ? static_cast<double>(intersection(busy, moving)) / comm_us : 0.0;
  }
  return result;
}

std::string stream_role(const std::string& stream_name) {
  const auto space = stream_name.rfind(' ');
  return space == std::string::npos ? stream_name : stream_name.substr(space + 1);
}

}  // namespace zest
