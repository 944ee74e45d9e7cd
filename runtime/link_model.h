// Bytes on the wire and, for the CPU backends, a modelled network between nodes. LinkCommunicator
// wraps a rank's communicator (and every group split from it): each collective and send adds
// what this rank puts on the wire to its WireBytes, intra- or inter-node (topology.h), and, when
// the link model is on, a collective whose group spans nodes first waits out what the inter-node
// ring would take, latency + bytes / bandwidth per ring step, on the caller's stream (the trace
// shows it on its own track, "comm inter-node"). Intra-node traffic runs as it does without it.
// A modelled wait longer than the communicator's timeout is not slept: it fails at once, in
// stream order, as a kCommTimeout naming the collective, the rank and the link's settings.
// Invariant: counts and delays depend only on the call and the topology, never on timing, so
// every rank of a group counts and waits alike.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/topology.h"
#include "runtime/trace.h"

namespace zest {

// world.link: the modelled inter-node network.
struct LinkOptions {
  // Whether inter-node collectives wait for the modelled link. Unset ("auto"): on for ranks as
  // threads of one process, where a node boundary exists only in the model; off for processes,
  // whose links are real. World resolves it.
  std::optional<bool> modelled;
  double bandwidth_gbit_s = 200.0;  // one direction, per node: 200 Gbit/s = 25 GB/s
  double latency_us = 10.0;         // per ring step (per message) across nodes
};

enum class WireKind { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kSend };
inline constexpr int kWireKinds = 5;
// "all_gather", "reduce_scatter", "all_reduce", "broadcast", "send": the metrics' names.
const char* wire_kind_name(WireKind kind);

// The axis of the device mesh (runtime/device_mesh.h) a group's traffic runs along, from the
// name it was split with: "tensor" (a tensor-parallel group), "pipeline" (a pipeline group's
// activations and gradients, the tied parameters summed across pipeline stages), and "data" for
// the rest — the world, whose collectives are the data-parallel ones without a mesh, and the
// data-parallel, hybrid and outer-loop groups. A group split from another keeps its axis unless
// its name says another.
enum class WireAxis { kData, kTensor, kPipeline };
inline constexpr int kWireAxes = 3;
// "data", "tensor", "pipeline": the metrics' names.
const char* wire_axis_name(WireAxis axis);
// The axis a group named `name` and split from a group of axis `parent` runs along.
WireAxis wire_axis_of(const std::string& name, WireAxis parent);

// What one rank has put on the wire since it started, by collective kind, in bytes, and the same
// bytes by mesh axis.
struct WireBytes {
  std::array<double, kWireKinds> intra_node{};
  std::array<double, kWireKinds> inter_node{};
  std::array<double, kWireAxes> by_axis{};  // intra- and inter-node together
  double intra_total() const;
  double inter_total() const;
  WireBytes operator-(const WireBytes& earlier) const;
};

// The ring model, as arithmetic. A collective over n ranks on k > 1 nodes is a ring in group
// order; c of its n edges cross nodes (c = k when each node's ranks are consecutive in it).
// Bytes each rank sends, with M the whole buffer (n × count elements for all_gather and
// reduce_scatter, count for all_reduce and broadcast):
//   all_gather, reduce_scatter: (n-1)/n · M     all_reduce: 2(n-1)/n · M
//   broadcast: (n-1)/n · M (a chain: all but one rank forward M; each rank counts the average)
//   send: M (the sender's; a receive sends nothing)
// Of those, c/n count as inter-node: the c crossing edges carry that share of the ring's
// traffic, spread evenly over its ranks, so any rank's count times n is the group's total.
// Time, when the ring crosses nodes: its steps run in lockstep, each as slow as its slowest
// link, an inter-node edge carrying M/n per step, with α the latency and β the bandwidth:
//   all_gather, reduce_scatter: (n-1)(α + M/(nβ))   all_reduce: 2(n-1)(α + M/(nβ))
//   broadcast: (n-1)α + M/β (pipelined)   barrier: 2(n-1)α   send across nodes: α + M/β
// Inside one node the delay is 0: the backend's own copies are the intra-node link.
struct LinkCost {
  double intra_bytes = 0.0;
  double inter_bytes = 0.0;
  std::chrono::nanoseconds delay{0};
};
LinkCost collective_cost(WireKind kind, int group_size, int crossing_edges, double buffer_bytes,
                         const LinkOptions& link);
LinkCost barrier_cost(int group_size, int crossing_edges, const LinkOptions& link);
LinkCost send_cost(bool across_nodes, double bytes, const LinkOptions& link);

// A rank's counters, shared by its communicator and the groups split from it.
class WireCounter {
 public:
  void add(WireKind kind, WireAxis axis, double intra, double inter);
  WireBytes snapshot() const;

 private:
  mutable std::mutex mutex_;
  WireBytes bytes_;
};

class LinkCommunicator final : public Communicator {
 public:
  // Waits `delay` on the stream's thread; tests inject a recorder.
  using Sleep = std::function<void(std::chrono::nanoseconds)>;

  // Wraps `inner`, whose members are placed by `topology`. `trace` may be null; `sleep` unset:
  // the real clock.
  LinkCommunicator(Communicator& inner, Topology topology, LinkOptions link, TraceRecorder* trace,
                   Sleep sleep = {});

  const WireCounter& wire() const { return *counter_; }

  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }
  void all_gather(Stream& stream, const void* send, void* recv, std::size_t count,
                  DType dtype) override;
  void reduce_scatter(Stream& stream, const void* send, void* recv, std::size_t count, DType dtype,
                      Reduction reduction) override;
  void all_reduce(Stream& stream, const void* send, void* recv, std::size_t count, DType dtype,
                  Reduction reduction) override;
  void broadcast(Stream& stream, void* buffer, std::size_t count, DType dtype, int root) override;
  void barrier(Stream& stream) override;
  void send(Stream& stream, const void* data, std::size_t count, DType dtype, int peer) override;
  void receive(Stream& stream, void* data, std::size_t count, DType dtype, int peer) override;
  // The group, wrapped too: its traffic counts here and crosses the same modelled links.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name,
                                      std::chrono::milliseconds timeout = {}) override;
  std::string group_name() const override { return inner_.group_name(); }
  int world_rank_of(int rank) const override { return inner_.world_rank_of(rank); }
  void label_next(const char* label) override { inner_.label_next(label); }
  void name_next(const std::string& caller) override { inner_.name_next(caller); }
  void begin_step(std::int64_t step) override { inner_.begin_step(step); }

 private:
  struct Shared {
    Topology topology;
    LinkOptions link;
    TraceRecorder* trace;
    Sleep sleep;
  };
  LinkCommunicator(std::unique_ptr<Communicator> owned, std::shared_ptr<const Shared> shared,
                   std::shared_ptr<WireCounter> counter, WireAxis axis);
  void place();  // members' nodes and the ring's crossing edges
  // Counts `cost` and, when the link is modelled and it has a delay, enqueues the wait.
  void charge(Stream& stream, WireKind kind, const char* op, const LinkCost& cost);
  void wait(Stream& stream, const char* op, std::chrono::nanoseconds delay);
  // The timeout's message for a modelled wait longer than the timeout.
  std::string too_slow(const char* op, std::chrono::nanoseconds delay) const;

  std::unique_ptr<Communicator> owned_;
  Communicator& inner_;
  std::shared_ptr<const Shared> shared_;
  std::shared_ptr<WireCounter> counter_;
  WireAxis axis_ = WireAxis::kData;
  int crossing_edges_ = 0;  // of the group's ring, in group order
  std::vector<int> nodes_;  // per group rank
};

}  // namespace zest
