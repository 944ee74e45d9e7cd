// What every rank builds around its device and communicator before it runs, whatever starts it
// (a thread or a process, the CPU or a GPU): its three streams, the collective-order check when
// the world asks for it, and the RankContext over them. Internal to World's backends.
// Invariant: destroyed before the device (the streams drain, and may use its memory, until then).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "runtime/checked_communicator.h"
#include "runtime/world.h"

namespace zest::detail {

class RankResources {
 public:
  RankResources(int rank, int world_size, Device& device, Communicator& communicator,
                const WorldOptions& options)
      : compute_(device.create_stream(prefix(rank) + "compute")),
        comm_(device.create_stream(prefix(rank) + "comm")),
        prefetch_(device.create_stream(prefix(rank) + "prefetch")),
        context_{rank,       world_size, device,
                 *compute_,  *comm_,     *prefetch_,
                 maybe_checked(communicator, options.check_collectives, &device, checked_),
                 options.trace.get(),
                 Topology(world_size, options.ranks_per_node > 0 ? options.ranks_per_node
                                                                  : world_size)} {}
  RankResources(const RankResources&) = delete;
  RankResources& operator=(const RankResources&) = delete;

  RankContext& context() { return context_; }

 private:
  static std::string prefix(int rank) { return "rank " + std::to_string(rank) + " "; }

  std::optional<CheckedCommunicator> checked_;  // first: outlives the streams' queued work
  std::unique_ptr<Stream> compute_;
  std::unique_ptr<Stream> comm_;
  std::unique_ptr<Stream> prefetch_;
  RankContext context_;
};

}  // namespace zest::detail
