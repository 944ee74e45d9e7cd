// Hybrid sharding's communicator (PyTorch FSDP's HYBRID_SHARD, MiCS): the ranks of a group (the
// world, or a pipeline stage's data-parallel group) in shard groups of `shard_size` consecutive
// ranks — a node by default — each of which holds every shard once, and replica groups of the
// ranks that hold the same shard (rank r of every shard group). To the engine it is its shard
// group: rank() and world_size() are the shard group's and all_gather stays inside it, so
// parameter gathers never leave the node; reduce_scatter reduces inside the shard group, then
// all-reduces this rank's shard across its replica group; all_reduce and barrier span every rank
// (inside, then across). Invariant: both steps always run, even where a group has one rank (the
// collective is then a copy): a dimension of size 1 never silently stops gradients syncing.
#pragma once

#include <memory>
#include <string>

#include "runtime/communicator.h"

namespace zest {

class HybridCommunicator final : public Communicator {
 public:
  // Splits `group` (collective over it: every rank calls this alike). A kConfig Error, one line
  // naming zero_optimization.hybrid_shard_size, when shard_size is < 1 or does not divide the
  // group's size.
  HybridCommunicator(Communicator& group, int shard_size);

  int replicas() const { return replica_->world_size(); }
  int shard_group() const { return shard_group_; }  // which shard group this rank is in
  Communicator& shard() { return *shard_; }
  Communicator& replica() { return *replica_; }

  int rank() const override { return shard_->rank(); }
  int world_size() const override { return shard_->world_size(); }
  std::chrono::milliseconds timeout() const override { return shard_->timeout(); }

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
  // Not offered: split the group this one was made from.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name,
                                      std::chrono::milliseconds timeout = {}) override;
  std::string group_name() const override { return shard_->group_name(); }
  std::vector<Communicator*> spanning_groups() override { return {shard_.get(), replica_.get()}; }
  int world_rank_of(int rank) const override { return shard_->world_rank_of(rank); }
  void label_next(const char* label) override;
  void name_next(const std::string& caller) override { shard_->name_next(caller); }
  void begin_step(std::int64_t step) override;

 private:
  // Passes the label of the caller's next collective to the step inside the shard group and,
  // marked, to the step across replicas.
  void label_both();

  int shard_group_ = 0;
  std::unique_ptr<Communicator> shard_;
  std::unique_ptr<Communicator> replica_;
  std::string label_;
};

}  // namespace zest
