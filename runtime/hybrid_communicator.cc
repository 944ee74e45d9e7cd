#include "runtime/hybrid_communicator.h"

#include <vector>

#include <fmt/format.h>

#include "base/dtype.h"
#include "base/error.h"
#include "runtime/device_mesh.h"

namespace zest {

namespace {

std::string members(const Communicator& group, int first, int stride, int count) {
  std::vector<int> ranks;
  for (int i = 0; i < count; ++i) ranks.push_back(group.world_rank_of(first + i * stride));
  return rank_list_text(ranks);
}

}  // namespace

HybridCommunicator::HybridCommunicator(Communicator& group, int shard_size) {
  const int size = group.world_size();
  if (shard_size < 1 || shard_size > size || size % shard_size != 0) {
    throw Error(ErrorKind::kConfig,
                fmt::format("zero_optimization.hybrid_shard_size: {} does not divide the {} "
                            "data-parallel ranks; shard groups must be equal (a divisor of {})",
                            shard_size, size, size));
  }
  const int rank = group.rank();
  shard_group_ = rank / shard_size;
  const int index = rank % shard_size;  // the shard this rank holds
  const int replicas = size / shard_size;
  // Note: every rank makes both splits, in this order, even where a group has one rank: the
  // splits are collective over `group`, and a group of one still runs its step (a copy).
  shard_ = group.split(shard_group_, rank,
                       fmt::format("shard group {} (ranks {})", shard_group_,
                                   members(group, shard_group_ * shard_size, 1, shard_size)));
  replica_ = group.split(index, rank,
                         fmt::format("replica group of shard {} (ranks {})", index,
                                     members(group, index, shard_size, replicas)));
}

void HybridCommunicator::label_next(const char* label) { label_ = label == nullptr ? "" : label; }

void HybridCommunicator::label_both() {
  if (label_.empty()) return;
  shard_->label_next(label_.c_str());
  label_ += " across replicas";
  replica_->label_next(label_.c_str());
  label_.clear();
}

void HybridCommunicator::begin_step(std::int64_t step) {
  shard_->begin_step(step);
  replica_->begin_step(step);
}

void HybridCommunicator::all_gather(Stream& stream, const void* send, void* recv,
                                    std::size_t count, DType dtype) {
  if (!label_.empty()) shard_->label_next(label_.c_str());
  label_.clear();
  shard_->all_gather(stream, send, recv, count, dtype);
}

void HybridCommunicator::reduce_scatter(Stream& stream, const void* send, void* recv,
                                        std::size_t count, DType dtype, Reduction reduction) {
  // Note: a mean of the replica groups' means is the mean over every rank (the groups are equal),
  // and a pre-divided mean divides by each group's size in turn: the reductions compose.
  label_both();
  shard_->reduce_scatter(stream, send, recv, count, dtype, reduction);
  replica_->all_reduce(stream, recv, recv, count, dtype, reduction);
}

void HybridCommunicator::all_reduce(Stream& stream, const void* send, void* recv,
                                    std::size_t count, DType dtype, Reduction reduction) {
  label_both();
  shard_->all_reduce(stream, send, recv, count, dtype, reduction);
  replica_->all_reduce(stream, recv, recv, count, dtype, reduction);
}

void HybridCommunicator::broadcast(Stream& stream, void* buffer, std::size_t count, DType dtype,
                                   int root) {
  if (!label_.empty()) shard_->label_next(label_.c_str());
  label_.clear();
  shard_->broadcast(stream, buffer, count, dtype, root);
}

void HybridCommunicator::barrier(Stream& stream) {
  label_.clear();
  shard_->barrier(stream);
  replica_->barrier(stream);
}

void HybridCommunicator::send(Stream& stream, const void* data, std::size_t count, DType dtype,
                              int peer) {
  shard_->send(stream, data, count, dtype, peer);
}

void HybridCommunicator::receive(Stream& stream, void* data, std::size_t count, DType dtype,
                                 int peer) {
  shard_->receive(stream, data, count, dtype, peer);
}

std::unique_ptr<Communicator> HybridCommunicator::split(int, int, const std::string&,
                                                        std::chrono::milliseconds) {
  throw Error(ErrorKind::kUsage,
              "a hybrid sharding communicator is not split; split the group it was made from");
}

}  // namespace zest
