#include "runtime/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/error.h"
#include "runtime/mpi_check.h"
#include "runtime/mpi_process.h"
#include "runtime/mpi_shared_mpi.h"

namespace zest {

using namespace mpi_detail;

namespace {


MPI_Datatype element_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt8: return MPI_INT8_T;
    case DType::kBFloat16:
    case DType::kFloat16: return MPI_UINT16_T;  // moved as bits; reduced through fp32
  }
  throw Error(ErrorKind::kInternal, "no MPI type for this dtype");
}

// ---- fp32 staging of reductions -------------------------------------------------------------
// Note: MPI has no bf16 (or, before MPI 4.1, fp16) type, and a user-defined MPI_Op on 16-bit
// data would have to round its fp32 partial sum back to 16 bits at every combining step — a
// running bf16 sum, which breaks the contract that 2-byte types are accumulated in fp32 and
// rounded once. So 16-bit inputs are widened into an fp32 temporary, reduced by MPI_SUM on
// MPI_FLOAT, and rounded back once. It doubles the bytes on the wire for those collectives; the
// engine reduces gradients in fp32 in every configuration built today.

template <typename T>
float load(const T* data, std::size_t i) {
  if constexpr (std::is_same_v<T, float>) {
    return data[i];
  } else {
    return static_cast<float>(data[i]);
  }
}

template <typename T>
void store(T* data, std::size_t i, float value) {
  if constexpr (std::is_same_v<T, float>) {
    data[i] = value;
  } else {
    data[i] = T(value);
  }
}

template <typename T>
void widen_typed(const void* source, std::size_t count, float* out, float divisor) {
  const T* in = static_cast<const T*>(source);
  if (divisor != 0.0f) {
    for (std::size_t i = 0; i < count; ++i) out[i] = load(in, i) / divisor;
  } else {
    for (std::size_t i = 0; i < count; ++i) out[i] = load(in, i);
  }
}

template <typename T>
void narrow_typed(const float* in, std::size_t count, void* destination, float divisor) {
  T* out = static_cast<T*>(destination);
  if (divisor != 0.0f) {
    for (std::size_t i = 0; i < count; ++i) store(out, i, in[i] / divisor);
  } else {
    for (std::size_t i = 0; i < count; ++i) store(out, i, in[i]);
  }
}

// out[i] = source[i] (÷ divisor, where divisor != 0), as the local backend computes it: a
// division, not a multiplication by the reciprocal, so the two backends agree bit for bit
// wherever MPI adds in rank order.
void widen(const void* source, DType dtype, std::size_t count, float* out, float divisor) {
  switch (dtype) {
    case DType::kFloat32: return widen_typed<float>(source, count, out, divisor);
    case DType::kBFloat16: return widen_typed<BFloat16>(source, count, out, divisor);
    case DType::kFloat16: return widen_typed<Float16>(source, count, out, divisor);
    default: break;
  }
  throw Error(ErrorKind::kInternal, "widen: not a reducible dtype");
}

// destination[i] = in[i] (÷ divisor, where divisor != 0), rounded once to `dtype`.
void narrow(const float* in, std::size_t count, void* destination, DType dtype, float divisor) {
  switch (dtype) {
    case DType::kFloat32: return narrow_typed<float>(in, count, destination, divisor);
    case DType::kBFloat16: return narrow_typed<BFloat16>(in, count, destination, divisor);
    case DType::kFloat16: return narrow_typed<Float16>(in, count, destination, divisor);
    default: break;
  }
  throw Error(ErrorKind::kInternal, "narrow: not a reducible dtype");
}
}  // namespace


namespace {

using Shared = MpiCommunicator::Shared;

// One collective as the stream runs it: stage inputs, wait for this rank's earlier collectives
// to start, check agreement, start, poll to completion, unstage the result.
struct Plan {
  Call call;
  const char* what = "";                                   // the MPI call, for errors
  std::function<void(Scratch&)> prepare;                    // before the start; may be empty
  std::function<int(MPI_Comm, Scratch&, MPI_Request*)> start;
  std::function<void(Scratch&)> finish;                     // after completion; may be empty
};

// Marks a collective that its stream skipped (the stream had failed): it never starts, so no
// later one may either — peers would pair them with the wrong collectives.
class Ticket {
 public:
  Ticket(std::shared_ptr<Shared> shared, Call call)
      : shared_(std::move(shared)), call_(call) {}
  ~Ticket() {
    if (!ran_) {
      shared_->break_with(ErrorKind::kPeerFailure,
                          shared_->where(call_) +
                              " was skipped because its stream had failed earlier");
    }
  }
  Ticket(const Ticket&) = delete;
  Ticket& operator=(const Ticket&) = delete;
  void mark_ran() { ran_ = true; }

 private:
  std::shared_ptr<Shared> shared_;
  Call call_;
  bool ran_ = false;
};

void enqueue_plan(Stream& stream, const std::shared_ptr<Shared>& shared, Plan plan,
                  std::string name, std::string label, std::int64_t step) {
  plan.call.name = std::move(name);
  plan.call.label = std::move(label);
  plan.call.step = step;
  auto ticket = std::make_shared<Ticket>(shared, plan.call);
  stream.enqueue([shared, ticket, plan = std::move(plan)] {
    ticket->mark_ran();
    auto scratch = std::make_shared<Scratch>();
    try {
      if (plan.prepare) plan.prepare(*scratch);
    } catch (const std::exception& error) {
      // Later collectives wait for this one to start; they must fail, not wait out the timeout.
      const auto* zest_error = dynamic_cast<const Error*>(&error);
      shared->break_with(zest_error ? zest_error->kind() : ErrorKind::kInternal,
                         shared->where(plan.call) + ": " + error.what());
      throw;
    }
    shared->wait_for_turn(plan.call);
    MPI_Request request = MPI_REQUEST_NULL;
    try {
      shared->check_agreement(plan.call, scratch);
      const int code = plan.start(shared->lane_of(plan.call), *scratch, &request);
      if (code != MPI_SUCCESS) shared->fail(plan.call, plan.what, code);
    } catch (...) {
      shared->pass_turn(plan.call);
      throw;
    }
    shared->pass_turn(plan.call);
    shared->complete(request, plan.call, plan.what, scratch);
    if (plan.finish) plan.finish(*scratch);
  });
}

}  // namespace

int mpi_detail::checked_count(std::size_t count, const char* op) {
  if (count > static_cast<std::size_t>(INT_MAX)) {
    throw Error(ErrorKind::kUsage, std::string(op) + " of " + std::to_string(count) +
                                       " elements: the mpi backend moves at most " +
                                       std::to_string(INT_MAX) +
                                       " elements per rank in one collective (MPI's int counts)");
  }
  return static_cast<int>(count);
}

namespace {

void require_reducible(DType dtype, const char* op) {
  if (dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16) return;
  throw Error(ErrorKind::kUsage, std::string(op) +
                                     ": reductions support fp32, bf16 and fp16, not " +
                                     dtype_name(dtype));
}

const char* byte_pointer(const void* p, std::size_t offset) {
  return static_cast<const char*>(p) + offset;
}

}  // namespace

// ---- the communicator ------------------------------------------------------------------------

namespace mpi_detail {

std::shared_ptr<Shared> make_shared_state(MPI_Comm base, std::chrono::milliseconds timeout,
                                          std::string name, std::vector<int> world_ranks) {
  auto shared = std::make_shared<Shared>();
  ZEST_MPI_CHECK(MPI_Comm_rank(base, &shared->rank));
  ZEST_MPI_CHECK(MPI_Comm_size(base, &shared->world_size));
  shared->timeout = timeout;
  shared->name = std::move(name);
  shared->world_ranks = std::move(world_ranks);
  const auto duplicate = [&] {
    MPI_Comm comm = MPI_COMM_NULL;
    ZEST_MPI_CHECK(MPI_Comm_dup(base, &comm));
    // Note: errors come back as codes and become zest Errors naming the collective and rank;
    // the caller (World) then decides to end the job, after printing the error.
    ZEST_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    return comm;
  };
  for (int lane = 0; lane < kLanes; ++lane) {
    shared->lanes.push_back(duplicate());
    shared->next_on_lane.push_back(static_cast<std::uint64_t>(lane));
  }
  shared->control = duplicate();
  shared->transfers = duplicate();
  return shared;
}

}  // namespace mpi_detail

MpiCommunicator::MpiCommunicator(std::chrono::milliseconds timeout)
    : rank_(MpiProcess::get().rank()),
      world_size_(MpiProcess::get().size()),
      timeout_(timeout),
      next_send_(static_cast<std::size_t>(world_size_), 0),
      next_receive_(static_cast<std::size_t>(world_size_), 0) {
  if (timeout.count() <= 0) throw Error(ErrorKind::kUsage, "mpi communicator: timeout must be > 0");
  shared_ = make_shared_state(MPI_COMM_WORLD, timeout, {}, {});
}

MpiCommunicator::MpiCommunicator(std::shared_ptr<Shared> shared)
    : shared_(std::move(shared)),
      rank_(shared_->rank),
      world_size_(shared_->world_size),
      timeout_(shared_->timeout),
      next_send_(static_cast<std::size_t>(world_size_), 0),
      next_receive_(static_cast<std::size_t>(world_size_), 0) {}

std::string MpiCommunicator::group_name() const { return shared_->name; }

int MpiCommunicator::world_rank_of(int rank) const { return shared_->world_rank(rank); }

MpiCommunicator::~MpiCommunicator() = default;

std::optional<Error> MpiCommunicator::failure() const {
  std::lock_guard lock(shared_->mutex);
  if (shared_->broken.empty()) return std::nullopt;
  return Error(shared_->broken_kind, shared_->broken);
}

void MpiCommunicator::all_gather(Stream& stream, const void* send, void* recv, std::size_t count,
                                 DType dtype) {
  const int n = checked_count(count, "all_gather");
  const MPI_Datatype type = element_type(dtype);
  const bool in_place =
      send == byte_pointer(recv, static_cast<std::size_t>(rank_) * count * dtype_size(dtype));
  Plan plan{{Op::kAllGather, next_sequence_++, count, dtype}, "MPI_Iallgather", {}, {}, {}};
  plan.start = [send, recv, n, type, in_place](MPI_Comm comm, Scratch&, MPI_Request* request) {
    return MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, type, recv, n, type, comm, request);
  };
  enqueue_plan(stream, shared_, std::move(plan), std::exchange(name_, {}),
               std::exchange(label_, {}), step_);
}

void MpiCommunicator::reduce_scatter(Stream& stream, const void* send, void* recv,
                                     std::size_t count, DType dtype, Reduction reduction) {
  require_reducible(dtype, "reduce_scatter");
  const int n = checked_count(count, "reduce_scatter");
  const std::size_t world = static_cast<std::size_t>(world_size_);
  const float divisor = static_cast<float>(world_size_);
  // Note: MPI_IN_PLACE would leave the result at the start of the buffer, not at this rank's
  // slice, and may scribble over the rest; the contract writes only the own slice, so in place
  // goes through a temporary.
  const bool in_place =
      recv == byte_pointer(send, static_cast<std::size_t>(rank_) * count * dtype_size(dtype));
  const bool widened = dtype != DType::kFloat32;
  const bool stage_send = widened || reduction == Reduction::kPreDividedMean;
  const bool stage_recv = widened || in_place;
  const float pre_divisor = reduction == Reduction::kPreDividedMean ? divisor : 0.0f;
  const float post_divisor = reduction == Reduction::kMean ? divisor : 0.0f;

  Plan plan{{Op::kReduceScatter, next_sequence_++, count, dtype, reduction},
            "MPI_Ireduce_scatter_block", {}, {}, {}};
  plan.prepare = [=](Scratch& scratch) {
    if (stage_send) {
      scratch.send.resize(world * count);
      widen(send, dtype, world * count, scratch.send.data(), pre_divisor);
    }
    if (stage_recv) scratch.recv.resize(count);
  };
  plan.start = [=](MPI_Comm comm, Scratch& scratch, MPI_Request* request) {
    const void* mpi_send = stage_send ? scratch.send.data() : send;
    void* mpi_recv = stage_recv ? static_cast<void*>(scratch.recv.data()) : recv;
    return MPI_Ireduce_scatter_block(mpi_send, mpi_recv, n, MPI_FLOAT, MPI_SUM, comm, request);
  };
  plan.finish = [=](Scratch& scratch) {
    if (stage_recv) {
      narrow(scratch.recv.data(), count, recv, dtype, post_divisor);
    } else if (post_divisor != 0.0f) {
      float* out = static_cast<float*>(recv);
      for (std::size_t i = 0; i < count; ++i) out[i] /= post_divisor;
    }
  };
  enqueue_plan(stream, shared_, std::move(plan), std::exchange(name_, {}),
               std::exchange(label_, {}), step_);
}

void MpiCommunicator::all_reduce(Stream& stream, const void* send, void* recv, std::size_t count,
                                 DType dtype, Reduction reduction) {
  require_reducible(dtype, "all_reduce");
  const int n = checked_count(count, "all_reduce");
  const float divisor = static_cast<float>(world_size_);
  const bool staged = dtype != DType::kFloat32 || reduction == Reduction::kPreDividedMean;
  const bool in_place = send == recv;
  const float pre_divisor = reduction == Reduction::kPreDividedMean ? divisor : 0.0f;
  const float post_divisor = reduction == Reduction::kMean ? divisor : 0.0f;

  Plan plan{{Op::kAllReduce, next_sequence_++, count, dtype, reduction}, "MPI_Iallreduce", {},
            {}, {}};
  plan.prepare = [=](Scratch& scratch) {
    if (!staged) return;
    scratch.recv.resize(count);
    widen(send, dtype, count, scratch.recv.data(), pre_divisor);
  };
  plan.start = [=](MPI_Comm comm, Scratch& scratch, MPI_Request* request) {
    if (staged) {
      return MPI_Iallreduce(MPI_IN_PLACE, scratch.recv.data(), n, MPI_FLOAT, MPI_SUM, comm,
                            request);
    }
    return MPI_Iallreduce(in_place ? MPI_IN_PLACE : send, recv, n, MPI_FLOAT, MPI_SUM, comm,
                          request);
  };
  plan.finish = [=](Scratch& scratch) {
    if (staged) {
      narrow(scratch.recv.data(), count, recv, dtype, post_divisor);
    } else if (post_divisor != 0.0f) {
      float* out = static_cast<float*>(recv);
      for (std::size_t i = 0; i < count; ++i) out[i] /= post_divisor;
    }
  };
  enqueue_plan(stream, shared_, std::move(plan), std::exchange(name_, {}),
               std::exchange(label_, {}), step_);
}

void MpiCommunicator::broadcast(Stream& stream, void* buffer, std::size_t count, DType dtype,
                                int root) {
  if (root < 0 || root >= world_size_) {
    throw Error(ErrorKind::kUsage, "broadcast root " + std::to_string(root) +
                                       " is outside world size " + std::to_string(world_size_));
  }
  const int n = checked_count(count, "broadcast");
  const MPI_Datatype type = element_type(dtype);
  Plan plan{{Op::kBroadcast, next_sequence_++, count, dtype, Reduction::kSum, root},
            "MPI_Ibcast", {}, {}, {}};
  plan.start = [buffer, n, type, root](MPI_Comm comm, Scratch&, MPI_Request* request) {
    return MPI_Ibcast(buffer, n, type, root, comm, request);
  };
  enqueue_plan(stream, shared_, std::move(plan), std::exchange(name_, {}),
               std::exchange(label_, {}), step_);
}

void MpiCommunicator::barrier(Stream& stream) {
  Plan plan{{Op::kBarrier, next_sequence_++}, "MPI_Ibarrier", {}, {}, {}};
  plan.start = [](MPI_Comm comm, Scratch&, MPI_Request* request) {
    return MPI_Ibarrier(comm, request);
  };
  enqueue_plan(stream, shared_, std::move(plan), std::exchange(name_, {}),
               std::exchange(label_, {}), step_);
}

}  // namespace zest
