// What every rank builds around its device and communicator before it runs, whatever starts it
// (a thread or a process, the CPU or a GPU): its three streams, the collective-order check when
// the world asks for it, the link model and wire counters (link_model.h) around all of it, and
// the RankContext over them. Internal to World's backends.
// Invariant: destroyed before the device (the streams drain, and may use its memory, until then).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "runtime/checked_communicator.h"
#include "runtime/link_model.h"
#include "runtime/world.h"

namespace zest::detail {

class RankResources {
 public:
  RankResources(int rank, int world_size, Device& device, Communicator& communicator,
                const WorldOptions& options)
      : link_(std::make_unique<LinkCommunicator>(
            maybe_checked(communicator, options.check_collectives, &device, checked_),
            topology(world_size, options), options.link, options.trace.get())),
        compute_(device.create_stream(prefix(rank) + "compute")),
        comm_(device.create_stream(prefix(rank) + "comm")),
        prefetch_(device.create_stream(prefix(rank) + "prefetch")),
        context_{rank,      world_size, device,
                 *compute_, *comm_,     *prefetch_,
                 *link_,    options.trace.get(), topology(world_size, options),
                 &link_->wire()} {}
  RankResources(const RankResources&) = delete;
  RankResources& operator=(const RankResources&) = delete;

  RankContext& context() { return context_; }

 private:
  static std::string prefix(int rank) { return "rank " + std::to_string(rank) + " "; }
  static Topology topology(int world_size, const WorldOptions& options) {
    return Topology(world_size, options.ranks_per_node > 0 ? options.ranks_per_node : world_size);
  }

  std::optional<CheckedCommunicator> checked_;  // first: outlives the streams' queued work
  std::unique_ptr<LinkCommunicator> link_;      // around checked_ (or the backend's)
  std::unique_ptr<Stream> compute_;
  std::unique_ptr<Stream> comm_;
  std::unique_ptr<Stream> prefetch_;
  RankContext context_;
};

}  // namespace zest::detail
