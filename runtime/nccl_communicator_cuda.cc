#include "runtime/nccl_communicator.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "base/cuda_check.h"
#include "base/error.h"
#include "runtime/cuda_device.h"
#include "runtime/cuda_stream.h"
#include "runtime/nccl_check.h"
#include "runtime/nccl_comm.h"

namespace zest {

namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt8:
      return ncclInt8;
  }
  throw Error(ErrorKind::kInternal, "no NCCL type for this dtype");
}

// Note: both means are ncclAvg. For floating types NCCL computes it as a sum of each input
// multiplied by 1/N (its PreMulSum), which is kPreDividedMean exactly and kMean up to rounding;
// a separate division after a sum would cost a kernel that runtime/ may not launch.
ncclRedOp_t nccl_op(Reduction reduction) {
  return reduction == Reduction::kSum ? ncclSum : ncclAvg;
}

const char* reduction_name(Reduction reduction) {
  switch (reduction) {
    case Reduction::kSum:
      return "sum";
    case Reduction::kMean:
      return "mean";
    case Reduction::kPreDividedMean:
      return "pre-divided mean";
  }
  return "?";
}

// The cudaStream_t of `stream`, which must be a CUDA stream of the communicator's GPU.
cudaStream_t stream_on(Stream& stream, int device, const std::string& what) {
  const cudaStream_t handle = cuda::stream_handle(stream, what.c_str());
  const int stream_device = static_cast<cuda::CudaStream&>(stream).device();
  if (stream_device != device) {
    throw Error(ErrorKind::kUsage,
                what + ": stream '" + stream.name() +
                    "' is on cuda:" + std::to_string(stream_device) +
                    ", but the rank's NCCL communicator is on cuda:" + std::to_string(device));
  }
  return handle;
}

}  // namespace

NcclCommunicator::NcclCommunicator(std::unique_ptr<nccl::GuardedComm> comm)
    : comm_(std::move(comm)),
      next_send_(static_cast<std::size_t>(comm_->world_size()), 0),
      next_receive_(static_cast<std::size_t>(comm_->world_size()), 0) {
  // Note: allocated once here, outside any step, as the pool allocator's rule asks.
  nccl::DeviceScope scope(comm_->device());
  ZEST_CUDA_CHECK(cudaMalloc(&barrier_word_, sizeof(float)));
  ZEST_CUDA_CHECK(cudaMemset(barrier_word_, 0, sizeof(float)));
}

NcclCommunicator::~NcclCommunicator() {
  comm_.reset();  // closes the communicator before the memory its kernels used goes
  (void)cudaFree(barrier_word_);
  (void)cudaGetLastError();
}

std::vector<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create_group(
    int world_size, std::chrono::milliseconds timeout) {
  if (world_size < 1) {
    throw Error(ErrorKind::kUsage,
                "an NCCL group needs at least 1 rank, got " + std::to_string(world_size));
  }
  if (timeout.count() <= 0) {
    throw Error(ErrorKind::kUsage, "the NCCL communicator's timeout must be positive");
  }
  const cuda::DeviceCount devices = cuda::visible_devices();
  if (devices.count < world_size) {
    throw Error(ErrorKind::kConfig,
                "the nccl backend runs one rank per GPU (NCCL forbids two ranks on one): " +
                    std::to_string(world_size) + " ranks need " + std::to_string(world_size) +
                    " GPUs, and this process sees " + std::to_string(devices.count) +
                    (devices.reason.empty() ? "" : " (" + devices.reason + ")"));
  }
  ncclUniqueId id;
  ZEST_NCCL_CHECK(ncclGetUniqueId(&id));
  std::vector<ncclComm_t> comms(world_size, nullptr);
  std::vector<ncclConfig_t> configs(world_size, nccl::nonblocking_config());
  {
    nccl::DeviceScope restore(0);
    // Note: one thread initializing several ranks must do it inside one group, or the first
    // ncclCommInitRank would wait for the others; nonblocking, each completes in the background.
    ZEST_NCCL_CHECK(ncclGroupStart());
    ncclResult_t status = ncclSuccess;
    for (int rank = 0; rank < world_size && (status == ncclSuccess || status == ncclInProgress);
         ++rank) {
      ZEST_CUDA_CHECK(cudaSetDevice(rank));
      status = ncclCommInitRankConfig(&comms[rank], world_size, id, rank, &configs[rank]);
    }
    const ncclResult_t end = ncclGroupEnd();
    ZEST_NCCL_CHECK(status);
    ZEST_NCCL_CHECK(end);
  }
  std::vector<std::unique_ptr<nccl::GuardedComm>> guarded;
  try {
    for (int rank = 0; rank < world_size; ++rank) {
      guarded.push_back(
          std::make_unique<nccl::GuardedComm>(comms[rank], rank, world_size, rank, timeout));
    }
  } catch (const std::exception& error) {
    // The ranks already initialized would wait out the timeout for the one that failed.
    for (auto& comm : guarded) comm->abort(std::string("another rank failed: ") + error.what());
    for (std::size_t rank = guarded.size() + 1; rank < comms.size(); ++rank) {
      (void)ncclCommAbort(comms[rank]);
    }
    throw;
  }
  std::vector<std::unique_ptr<NcclCommunicator>> group;
  for (auto& comm : guarded) group.push_back(std::make_unique<NcclCommunicator>(std::move(comm)));
  return group;
}

void NcclCommunicator::destroy_group(std::vector<std::unique_ptr<NcclCommunicator>>& group) {
  for (auto& communicator : group) {
    if (communicator) communicator->comm_->begin_close();
  }
  group.clear();
}

int NcclCommunicator::rank() const { return comm_->rank(); }
int NcclCommunicator::world_size() const { return comm_->world_size(); }
std::chrono::milliseconds NcclCommunicator::timeout() const { return comm_->timeout(); }
int NcclCommunicator::device() const { return comm_->device(); }

void NcclCommunicator::label_next(const char* label) { label_ = label ? label : ""; }

void NcclCommunicator::abort(const std::string& reason) { comm_->abort(reason); }

std::optional<Error> NcclCommunicator::failure() const { return comm_->failure()->get(); }

std::string NcclCommunicator::describe(const char* op, std::size_t count, DType dtype) {
  std::string text =
      std::string(op) + " of " + std::to_string(count) + " " + dtype_name(dtype) + " elements";
  if (!label_.empty()) text += " ('" + label_ + "')";
  if (!name_.empty()) text = name_;
  label_.clear();
  name_.clear();
  return text + at_step(step_) + in_group();
}

std::string NcclCommunicator::in_group() const {
  return group_name_.empty() ? "" : " in the " + group_name_;
}

int NcclCommunicator::world_rank_of(int rank) const {
  return world_ranks_.empty() ? rank : world_ranks_.at(static_cast<std::size_t>(rank));
}

void NcclCommunicator::check_peer(int peer, const char* op) const {
  if (peer < 0 || peer >= world_size()) {
    throw Error(ErrorKind::kUsage, std::string(op) + " to rank " + std::to_string(peer) +
                                       ": outside a group of " + std::to_string(world_size()) +
                                       " ranks" + in_group());
  }
  if (peer == rank()) {
    throw Error(ErrorKind::kUsage, std::string(op) + " on rank " +
                                       std::to_string(world_rank_of(rank())) +
                                       ": a rank cannot send to or receive from itself");
  }
}

void NcclCommunicator::send(Stream& stream, const void* data, std::size_t count, DType dtype,
                            int peer) {
  check_peer(peer, "send");
  const std::uint64_t sequence = next_send_[static_cast<std::size_t>(peer)]++;
  std::string what = describe_collective("send", sequence, count, dtype, Reduction::kSum, 0,
                                         label_) +
                     " to rank " + std::to_string(world_rank_of(peer)) + at_step(step_) +
                     in_group();
  label_.clear();
  name_.clear();
  const cudaStream_t handle = stream_on(stream, device(), what);
  if (count == 0) return;  // the receive's count is 0 too: nothing moves
  comm_->issue(what, handle, [&](ncclComm_t comm) {
    ZEST_NCCL_CHECK(ncclSend(data, count, nccl_type(dtype), peer, comm, handle));
  });
  enqueue_check(stream);
}

void NcclCommunicator::receive(Stream& stream, void* data, std::size_t count, DType dtype,
                               int peer) {
  check_peer(peer, "receive");
  const std::uint64_t sequence = next_receive_[static_cast<std::size_t>(peer)]++;
  std::string what = describe_collective("receive", sequence, count, dtype, Reduction::kSum, 0,
                                         label_) +
                     " from rank " + std::to_string(world_rank_of(peer)) + at_step(step_) +
                     in_group();
  label_.clear();
  name_.clear();
  const cudaStream_t handle = stream_on(stream, device(), what);
  if (count == 0) return;
  comm_->issue(what, handle, [&](ncclComm_t comm) {
    ZEST_NCCL_CHECK(ncclRecv(data, count, nccl_type(dtype), peer, comm, handle));
  });
  enqueue_check(stream);
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, const std::string& name,
                                                      std::chrono::milliseconds timeout) {
  if (timeout.count() < 0) throw Error(ErrorKind::kUsage, "split: the timeout must be >= 0");
  const int n = world_size();
  // Every rank's color and key, for the group's world ranks: all-gathered through device memory
  // on a stream of this call's own, and read back synchronously (a split is set-up, not a step).
  std::vector<std::int32_t> all(static_cast<std::size_t>(2 * n), 0);
  {
    nccl::DeviceScope scope(device());
    cudaStream_t stream = nullptr;
    std::int32_t* words = nullptr;
    ZEST_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const auto cleanup = [&] {
      (void)cudaStreamSynchronize(stream);
      if (words != nullptr) (void)cudaFree(words);
      (void)cudaStreamDestroy(stream);
      (void)cudaGetLastError();
    };
    try {
      ZEST_CUDA_CHECK(cudaMalloc(&words, all.size() * sizeof(std::int32_t)));
      const std::int32_t mine[2] = {color < 0 ? -1 : color, key};
      std::int32_t* slot = words + 2 * rank();
      ZEST_CUDA_CHECK(cudaMemcpyAsync(slot, mine, sizeof(mine), cudaMemcpyHostToDevice, stream));
      comm_->issue("split ('" + name + "'): all_gather of every rank's color" + in_group(), stream,
                   [&](ncclComm_t comm) {
                     ZEST_NCCL_CHECK(ncclAllGather(slot, words, 2, ncclInt32, comm, stream));
                   });
      ZEST_CUDA_CHECK(cudaMemcpyAsync(all.data(), words, all.size() * sizeof(std::int32_t),
                                      cudaMemcpyDeviceToHost, stream));
      // Note: bounded: should a peer never join, the watchdog aborts the communicator after the
      // timeout and the all-gather's kernel exits.
      ZEST_CUDA_CHECK(cudaStreamSynchronize(stream));
      comm_->failure()->throw_if_failed();
    } catch (...) {
      cleanup();
      throw;
    }
    cleanup();
  }
  std::vector<int> members;
  for (int r = 0; r < n; ++r) {
    if (color >= 0 && all[static_cast<std::size_t>(2 * r)] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return all[static_cast<std::size_t>(2 * a + 1)] < all[static_cast<std::size_t>(2 * b + 1)];
  });
  std::vector<int> world;
  for (int r : members) world.push_back(world_rank_of(r));
  const std::string where =
      "rank " + std::to_string(world_rank_of(rank())) + (name.empty() ? "" : " in the " + name);
  std::unique_ptr<nccl::GuardedComm> group =
      comm_->split(color, key, timeout.count() > 0 ? timeout : this->timeout(), where);
  if (!group) return nullptr;
  auto communicator = std::make_unique<NcclCommunicator>(std::move(group));
  communicator->group_name_ = name;
  communicator->world_ranks_ = std::move(world);
  return communicator;
}

void NcclCommunicator::enqueue_check(Stream& stream) {
  // Note: a host function after each collective (a few microseconds of the stream's time) is
  // how a watchdog's abort reaches the stream: the aborted kernels exit, this check fails the
  // stream, and its synchronize — and the streams waiting on its events — raise the cause.
  stream.enqueue([failure = comm_->failure()] { failure->throw_if_failed(); });
}

void NcclCommunicator::all_gather(Stream& stream, const void* send, void* recv, std::size_t count,
                                  DType dtype) {
  const std::string what = describe("all_gather", count, dtype);
  const cudaStream_t handle = stream_on(stream, device(), what);
  if (count == 0) return;  // every rank's count is 0 too: nothing moves
  comm_->issue(what, handle, [&](ncclComm_t comm) {
    ZEST_NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(dtype), comm, handle));
  });
  enqueue_check(stream);
}

void NcclCommunicator::reduce_scatter(Stream& stream, const void* send, void* recv,
                                      std::size_t count, DType dtype, Reduction reduction) {
  const std::string what = describe(
      (std::string("reduce_scatter (") + reduction_name(reduction) + ")").c_str(), count, dtype);
  const cudaStream_t handle = stream_on(stream, device(), what);
  if (count == 0) return;
  comm_->issue(what, handle, [&](ncclComm_t comm) {
    ZEST_NCCL_CHECK(
        ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(reduction), comm, handle));
  });
  enqueue_check(stream);
}

void NcclCommunicator::all_reduce(Stream& stream, const void* send, void* recv, std::size_t count,
                                  DType dtype, Reduction reduction) {
  const std::string what = describe(
      (std::string("all_reduce (") + reduction_name(reduction) + ")").c_str(), count, dtype);
  const cudaStream_t handle = stream_on(stream, device(), what);
  if (count == 0) return;
  comm_->issue(what, handle, [&](ncclComm_t comm) {
    ZEST_NCCL_CHECK(
        ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(reduction), comm, handle));
  });
  enqueue_check(stream);
}

void NcclCommunicator::broadcast(Stream& stream, void* buffer, std::size_t count, DType dtype,
                                 int root) {
  if (root < 0 || root >= world_size()) {
    throw Error(ErrorKind::kUsage, "broadcast root " + std::to_string(root) +
                                       " is outside world size " + std::to_string(world_size()));
  }
  const std::string what =
      describe(("broadcast from rank " + std::to_string(root)).c_str(), count, dtype);
  const cudaStream_t handle = stream_on(stream, device(), what);
  if (count == 0) return;
  comm_->issue(what, handle, [&](ncclComm_t comm) {
    ZEST_NCCL_CHECK(ncclBroadcast(buffer, buffer, count, nccl_type(dtype), root, comm, handle));
  });
  enqueue_check(stream);
}

void NcclCommunicator::barrier(Stream& stream) {
  std::string what = "barrier";
  if (!label_.empty()) what += " ('" + label_ + "')";
  if (!name_.empty()) what = name_;
  what += at_step(step_);
  label_.clear();
  name_.clear();
  const cudaStream_t handle = stream_on(stream, device(), what);
  comm_->issue(what, handle, [&](ncclComm_t comm) {
    ZEST_NCCL_CHECK(
        ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat32, ncclSum, comm, handle));
  });
  enqueue_check(stream);
}

}  // namespace zest
