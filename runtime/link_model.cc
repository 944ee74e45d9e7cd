#include "runtime/link_model.h"

#include <thread>
#include <utility>

#include <fmt/format.h>

#include "base/dtype.h"
#include "base/error.h"

namespace zest {

namespace {

// Note: saturates, since a link slow enough (bandwidth_gbit_s 1e-300) would overflow the 64-bit
// count into a negative delay, which turned the model off instead of timing out.
std::chrono::nanoseconds nanoseconds(double seconds) {
  const double count = seconds * 1e9 + 0.5;
  constexpr double kMost = 9.0e18;  // below 2^63
  if (!(count < kMost)) return std::chrono::nanoseconds::max();
  return std::chrono::nanoseconds(static_cast<std::int64_t>(count));
}

double bytes_per_second(const LinkOptions& link) { return link.bandwidth_gbit_s * 1e9 / 8.0; }

// Note: sleep_for overshoots by tens of microseconds, more than a latency of 10 µs; the last
// stretch is spun so that many small collectives do not each add the scheduler's slack.
void sleep_precisely(std::chrono::nanoseconds delay) {
  const auto until = std::chrono::steady_clock::now() + delay;
  constexpr auto kSpin = std::chrono::microseconds(200);
  if (delay > kSpin) std::this_thread::sleep_for(delay - kSpin);
  while (std::chrono::steady_clock::now() < until) {
  }
}

}  // namespace

const char* wire_kind_name(WireKind kind) {
  switch (kind) {
    case WireKind::kAllGather: return "all_gather";
    case WireKind::kReduceScatter: return "reduce_scatter";
    case WireKind::kAllReduce: return "all_reduce";
    case WireKind::kBroadcast: return "broadcast";
    case WireKind::kSend: return "send";
  }
  return "?";
}

double WireBytes::intra_total() const {
  double sum = 0.0;
  for (double bytes : intra_node) sum += bytes;
  return sum;
}

double WireBytes::inter_total() const {
  double sum = 0.0;
  for (double bytes : inter_node) sum += bytes;
  return sum;
}

WireBytes WireBytes::operator-(const WireBytes& earlier) const {
  WireBytes difference;
  for (int k = 0; k < kWireKinds; ++k) {
    difference.intra_node[k] = intra_node[k] - earlier.intra_node[k];
    difference.inter_node[k] = inter_node[k] - earlier.inter_node[k];
  }
  for (int a = 0; a < kWireAxes; ++a) difference.by_axis[a] = by_axis[a] - earlier.by_axis[a];
  return difference;
}

const char* wire_axis_name(WireAxis axis) {
  switch (axis) {
    case WireAxis::kData: return "data";
    case WireAxis::kTensor: return "tensor";
    case WireAxis::kPipeline: return "pipeline";
  }
  return "?";
}

// Note: by the names runtime/device_mesh.h and pipeline/pipeline_trainer.cc give the groups.
WireAxis wire_axis_of(const std::string& name, WireAxis parent) {
  const auto has = [&](const char* words) { return name.find(words) != std::string::npos; };
  if (has("tensor-parallel group")) return WireAxis::kTensor;
  if (has("pipeline group") || has("tied parameters")) return WireAxis::kPipeline;
  if (has("data-parallel group")) return WireAxis::kData;
  return parent;
}

LinkCost collective_cost(WireKind kind, int group_size, int crossing_edges, double buffer_bytes,
                         const LinkOptions& link) {
  LinkCost cost;
  const double n = group_size;
  if (group_size < 2) return cost;  // a group of one sends nothing
  const double steps = kind == WireKind::kAllReduce ? 2.0 * (n - 1.0) : n - 1.0;
  const double sent = steps / n * buffer_bytes;
  const double inter_share = crossing_edges / n;
  cost.inter_bytes = sent * inter_share;
  cost.intra_bytes = sent - cost.inter_bytes;
  if (crossing_edges == 0) return cost;
  const double alpha = link.latency_us * 1e-6;
  const double beta = bytes_per_second(link);
  const double seconds = kind == WireKind::kBroadcast
                             ? (n - 1.0) * alpha + buffer_bytes / beta
                             : steps * (alpha + buffer_bytes / n / beta);
  cost.delay = nanoseconds(seconds);
  return cost;
}

LinkCost barrier_cost(int group_size, int crossing_edges, const LinkOptions& link) {
  LinkCost cost;
  if (group_size > 1 && crossing_edges > 0) {
    cost.delay = nanoseconds(2.0 * (group_size - 1) * link.latency_us * 1e-6);
  }
  return cost;
}

LinkCost send_cost(bool across_nodes, double bytes, const LinkOptions& link) {
  LinkCost cost;
  if (!across_nodes) {
    cost.intra_bytes = bytes;
    return cost;
  }
  cost.inter_bytes = bytes;
  cost.delay = nanoseconds(link.latency_us * 1e-6 + bytes / bytes_per_second(link));
  return cost;
}

void WireCounter::add(WireKind kind, WireAxis axis, double intra, double inter) {
  std::lock_guard lock(mutex_);
  bytes_.intra_node[static_cast<int>(kind)] += intra;
  bytes_.inter_node[static_cast<int>(kind)] += inter;
  bytes_.by_axis[static_cast<int>(axis)] += intra + inter;
}

WireBytes WireCounter::snapshot() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

LinkCommunicator::LinkCommunicator(Communicator& inner, Topology topology, LinkOptions link,
                                   TraceRecorder* trace, Sleep sleep)
    : inner_(inner),
      shared_(std::make_shared<const Shared>(
          Shared{topology, link, trace, sleep ? std::move(sleep) : Sleep(sleep_precisely)})),
      counter_(std::make_shared<WireCounter>()) {
  place();
}

LinkCommunicator::LinkCommunicator(std::unique_ptr<Communicator> owned,
                                   std::shared_ptr<const Shared> shared,
                                   std::shared_ptr<WireCounter> counter, WireAxis axis)
    : owned_(std::move(owned)),
      inner_(*owned_),
      shared_(std::move(shared)),
      counter_(std::move(counter)),
      axis_(axis) {
  place();
}

void LinkCommunicator::place() {
  const int n = inner_.world_size();
  for (int r = 0; r < n; ++r) nodes_.push_back(shared_->topology.node_of(inner_.world_rank_of(r)));
  crossing_edges_ = 0;
  for (int r = 0; r < n && n > 1; ++r) {
    if (nodes_[r] != nodes_[(r + 1) % n]) ++crossing_edges_;
  }
}

void LinkCommunicator::charge(Stream& stream, WireKind kind, const char* op,
                              const LinkCost& cost) {
  counter_->add(kind, axis_, cost.intra_bytes, cost.inter_bytes);
  wait(stream, op, cost.delay);
}

void LinkCommunicator::wait(Stream& stream, const char* op, std::chrono::nanoseconds delay) {
  if (delay.count() <= 0 || !shared_->link.modelled.value_or(false)) return;
  if (delay > timeout()) {
    // A wait the timeout would end is not slept out: it fails in stream order, at once, as the
    // stalled collective it models.
    stream.enqueue([message = too_slow(op, delay)]() -> void {
      throw Error(ErrorKind::kCommTimeout, message);
    });
    return;
  }
  const std::string track = stream_role(stream.name()) + " inter-node";
  stream.enqueue([shared = shared_, delay, track, op = std::string(op),
                  rank = inner_.world_rank_of(inner_.rank())] {
    const std::int64_t begin = shared->trace ? TraceRecorder::now_us() : 0;
    shared->sleep(delay);
    if (shared->trace) {
      shared->trace->add({rank, track, "inter-node " + op, begin, TraceRecorder::now_us(), -1});
    }
  });
}

std::string LinkCommunicator::too_slow(const char* op, std::chrono::nanoseconds delay) const {
  const std::string group = group_name().empty() ? "" : " in the " + group_name();
  const double seconds = std::chrono::duration<double>(delay).count();
  return fmt::format("{} on rank {}{}: timed out: the modelled inter-node link takes {:.3g} s, "
                     "more than the timeout of {} (world.link.bandwidth_gbit_s {:g}, latency_us "
                     "{:g}; world.timeout_s sets the limit)",
                     op, world_rank_of(rank()), group, seconds, seconds_text(timeout()),
                     shared_->link.bandwidth_gbit_s, shared_->link.latency_us);
}

void LinkCommunicator::all_gather(Stream& stream, const void* send, void* recv, std::size_t count,
                                  DType dtype) {
  const double bytes = static_cast<double>(count * dtype_size(dtype)) * world_size();
  charge(stream, WireKind::kAllGather, "all_gather",
         collective_cost(WireKind::kAllGather, world_size(), crossing_edges_, bytes,
                         shared_->link));
  inner_.all_gather(stream, send, recv, count, dtype);
}

void LinkCommunicator::reduce_scatter(Stream& stream, const void* send, void* recv,
                                      std::size_t count, DType dtype, Reduction reduction) {
  const double bytes = static_cast<double>(count * dtype_size(dtype)) * world_size();
  charge(stream, WireKind::kReduceScatter, "reduce_scatter",
         collective_cost(WireKind::kReduceScatter, world_size(), crossing_edges_, bytes,
                         shared_->link));
  inner_.reduce_scatter(stream, send, recv, count, dtype, reduction);
}

void LinkCommunicator::all_reduce(Stream& stream, const void* send, void* recv, std::size_t count,
                                  DType dtype, Reduction reduction) {
  const double bytes = static_cast<double>(count * dtype_size(dtype));
  charge(stream, WireKind::kAllReduce, "all_reduce",
         collective_cost(WireKind::kAllReduce, world_size(), crossing_edges_, bytes,
                         shared_->link));
  inner_.all_reduce(stream, send, recv, count, dtype, reduction);
}

void LinkCommunicator::broadcast(Stream& stream, void* buffer, std::size_t count, DType dtype,
                                 int root) {
  const double bytes = static_cast<double>(count * dtype_size(dtype));
  charge(stream, WireKind::kBroadcast, "broadcast",
         collective_cost(WireKind::kBroadcast, world_size(), crossing_edges_, bytes,
                         shared_->link));
  inner_.broadcast(stream, buffer, count, dtype, root);
}

void LinkCommunicator::barrier(Stream& stream) {
  wait(stream, "barrier", barrier_cost(world_size(), crossing_edges_, shared_->link).delay);
  inner_.barrier(stream);
}

void LinkCommunicator::send(Stream& stream, const void* data, std::size_t count, DType dtype,
                            int peer) {
  // Note: only the sender waits; the receiver's side waits for the sender's post anyway.
  const bool across = peer >= 0 && peer < world_size() && nodes_[peer] != nodes_[rank()];
  charge(stream, WireKind::kSend, "send",
         send_cost(across, static_cast<double>(count * dtype_size(dtype)), shared_->link));
  inner_.send(stream, data, count, dtype, peer);
}

void LinkCommunicator::receive(Stream& stream, void* data, std::size_t count, DType dtype,
                               int peer) {
  inner_.receive(stream, data, count, dtype, peer);
}

std::unique_ptr<Communicator> LinkCommunicator::split(int color, int key, const std::string& name,
                                                      std::chrono::milliseconds timeout) {
  std::unique_ptr<Communicator> group = inner_.split(color, key, name, timeout);
  if (!group) return nullptr;
  return std::unique_ptr<Communicator>(
      new LinkCommunicator(std::move(group), shared_, counter_, wire_axis_of(name, axis_)));
}

}  // namespace zest
