// The ranks of a data-parallel group and how they are started. A World runs one function per
// rank with that rank's context — its device, streams, communicator — and joins them. With the
// `local` backend the ranks are threads of this process. Invariant: run() returns only after
// every rank has finished, and if any rank failed it throws the first failure (the cause, not
// the peers' echoes of it), naming its rank.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "memory/allocator.h"
#include "runtime/communicator.h"
#include "runtime/device.h"

namespace zest {

struct WorldOptions {
  int ranks = 1;
  std::string backend = "local";
  DeviceKind device = DeviceKind::kCpu;
  std::size_t device_memory = kUnlimitedCapacity;  // per rank, bytes
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

// Everything one rank works with. Streams: `compute` runs the model; `comm` runs gradient
// reductions and parameter gathers; `prefetch` runs ZeRO-3's gathers ahead of use.
struct RankContext {
  int rank = 0;
  int world_size = 1;
  Device& device;
  Stream& compute;
  Stream& comm;
  Stream& prefetch;
  Communicator& communicator;

  Allocator& allocator() const { return device.allocator(); }
  // Waits for all of this rank's streams; throws the first stream error.
  void synchronize() const;
};

class World {
 public:
  explicit World(WorldOptions options);

  int size() const { return options_.ranks; }
  const WorldOptions& options() const { return options_; }

  // Runs `work` once per rank and joins. Throws the first failure as "rank R: ...".
  void run(const std::function<void(RankContext&)>& work) const;

 private:
  WorldOptions options_;
};

}  // namespace zest
