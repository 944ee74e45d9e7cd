// The shape-only device's communicator (runtime/shape_device.h): one rank that believes it is
// rank `rank` of `world_size`. Its collectives and transfers do nothing — the sizes the caller
// passes are its own, so the buffers it allocates for them are right — and enqueue nothing, so
// the streams' order is the caller's alone. Ranks of a symmetric job are alike, so the planner
// runs one of them instead of the whole world. It has no peers to form groups with: split()
// refuses (a plan that needs groups is made otherwise).
#pragma once

#include <chrono>

#include "runtime/communicator.h"

namespace zest::shape {

class ShapeCommunicator final : public Communicator {
 public:
  ShapeCommunicator(int rank, int world_size);

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
};

}  // namespace zest::shape
