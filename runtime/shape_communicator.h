// The shape-only device's communicator (runtime/shape_device.h): one rank that believes it is
// rank `rank` of `world_size`. Its collectives and transfers do nothing — the sizes the caller
// passes are its own, so the buffers it allocates for them are right — and enqueue nothing, so
// the streams' order is the caller's alone. Ranks of a symmetric job are alike, so the planner
// runs one of them instead of the whole world. It has no peers whose colors would size a group,
// so the caller says what each split answers (the planner knows its job's groups: hpZ's, a
// hybrid shard group's and its replica group, a pipeline stage's groups and those split off
// them in turn); a split beyond those refuses.
#pragma once

#include <chrono>
#include <deque>
#include <utility>
#include <vector>

#include "runtime/communicator.h"

namespace zest::shape {

// What one split() answers: this rank's place in the group it joins, and what that group's own
// splits answer in turn (a pipeline stage's data-parallel group splits off hpZ's group or the
// hybrid shard and replica groups).
struct ShapeGroup {
  ShapeGroup(int rank, int size, std::vector<ShapeGroup> splits = {})
      : rank(rank), size(size), splits(std::move(splits)) {}
  int rank = 0;
  int size = 1;
  std::vector<ShapeGroup> splits;
};

class ShapeCommunicator final : public Communicator {
 public:
  // `splits`: the groups this rank's splits join, in the order they are made.
  ShapeCommunicator(int rank, int world_size, std::deque<ShapeGroup> splits = {});

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(0); }

  void all_gather(Stream&, const void*, void*, std::size_t, DType) override {}
  void reduce_scatter(Stream&, const void*, void*, std::size_t, DType, Reduction) override {}
  void all_reduce(Stream&, const void*, void*, std::size_t, DType, Reduction) override {}
  void broadcast(Stream&, void*, std::size_t, DType, int) override {}
  void barrier(Stream&) override {}
  void send(Stream&, const void*, std::size_t, DType, int) override {}
  void receive(Stream&, void*, std::size_t, DType, int) override {}
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name,
                                      std::chrono::milliseconds timeout) override;

 private:
  const int rank_;
  const int world_size_;
  std::deque<ShapeGroup> splits_;
};

}  // namespace zest::shape
