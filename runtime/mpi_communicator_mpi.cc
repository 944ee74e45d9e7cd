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

namespace zest {

namespace {

using Clock = std::chrono::steady_clock;

enum class Op : std::uint64_t { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kBarrier };

const char* op_name(Op op) {
  switch (op) {
    case Op::kAllGather: return "all_gather";
    case Op::kReduceScatter: return "reduce_scatter";
    case Op::kAllReduce: return "all_reduce";
    case Op::kBroadcast: return "broadcast";
    case Op::kBarrier: return "barrier";
  }
  return "?";
}

// What this rank passed to one collective: enough to describe it and to check that every rank
// called the same thing.
struct Call {
  Op op = Op::kBarrier;
  std::uint64_t sequence = 0;
  std::size_t count = 0;
  DType dtype = DType::kFloat32;
  Reduction reduction = Reduction::kSum;
  int root = 0;
  // For errors: the caller's name for it (name_next), or empty for describe(); its label; the
  // step its rank was in when it was issued.
  std::string name = {};
  std::string label = {};
  std::int64_t step = 0;

  // The fields every rank must agree on, as exchanged by the agreement check.
  static constexpr int kSignatureLength = 5;
  std::array<std::uint64_t, kSignatureLength> signature() const {
    return {static_cast<std::uint64_t>(op), count, static_cast<std::uint64_t>(dtype),
            static_cast<std::uint64_t>(reduction), static_cast<std::uint64_t>(root)};
  }
  static Call from_signature(std::uint64_t sequence, const std::uint64_t* words) {
    return {static_cast<Op>(words[0]), sequence, static_cast<std::size_t>(words[1]),
            static_cast<DType>(words[2]), static_cast<Reduction>(words[3]),
            static_cast<int>(words[4])};
  }
  // "all_reduce #12 (1000 x bf16, mean)", with the label if it has one.
  std::string describe() const {
    if (!name.empty()) return name;
    return describe_collective(op_name(op), sequence, count, dtype, reduction, root, label);
  }
};

MPI_Datatype element_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kInt32: return MPI_INT32_T;
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

// fp32 buffers a collective stages through. Owned by the enqueued closure, and kept alive past
// a timeout (MPI may still write into them).
struct Scratch {
  std::vector<float> send;
  std::vector<float> recv;
  std::array<std::uint64_t, Call::kSignatureLength> signature{};  // this rank's, sent
  std::vector<std::uint64_t> signatures;  // every rank's, all-gathered by the agreement check
};

}  // namespace

// ---- shared state ----------------------------------------------------------------------------

// Note: collectives are matched across ranks by host order, as in the local backend, but MPI
// matches nonblocking collectives on one communicator by the order they are started. Starting
// them strictly in host order would make a gather issued on `prefetch` wait for a
// reduce-scatter issued just before it on `comm` that is still waiting for compute — and lose
// the overlap. So collective s goes on lane s mod kLanes, one duplicated communicator each, and
// waits only for collective s − kLanes to have started: the order on every lane is the host
// order on every rank, and up to kLanes − 1 later collectives may start past a stalled one.
// Waiting only on earlier-issued collectives cannot deadlock: anything an earlier collective
// waits for was itself enqueued earlier.
constexpr int kLanes = 16;

struct MpiCommunicator::Shared {
  std::vector<MPI_Comm> lanes;
  MPI_Comm control = MPI_COMM_NULL;  // splits only: host-side, never a stream's
  MPI_Comm transfers = MPI_COMM_NULL;  // point to point only
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds timeout{0};
  std::string name;              // the group's, for errors; empty: the world
  std::vector<int> world_ranks;  // each rank's in the world, for errors
  std::uint64_t next_split = 0;

  std::mutex mutex;
  std::condition_variable turn_changed;
  std::vector<std::uint64_t> next_on_lane;  // the next collective each lane may start
  std::string broken;                       // non-empty: why every later collective fails at once
  ErrorKind broken_kind = ErrorKind::kInternal;
  std::vector<std::shared_ptr<Scratch>> abandoned;  // of collectives MPI may still complete

  ~Shared() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Comm& lane : lanes) MPI_Comm_free(&lane);
    for (MPI_Comm* comm : {&control, &transfers}) {
      if (*comm != MPI_COMM_NULL) MPI_Comm_free(comm);
    }
  }

  int world_rank(int group_rank) const {
    return world_ranks.empty() ? group_rank : world_ranks[static_cast<std::size_t>(group_rank)];
  }
  std::string in_group() const { return name.empty() ? "" : " in the " + name; }

  MPI_Comm lane_of(const Call& call) const {
    return lanes[static_cast<std::size_t>(call.sequence % kLanes)];
  }

  std::string where(const Call& call) const {
    if (!name.empty()) {
      return call.describe() + at_step(call.step) + " on rank " +
             std::to_string(world_rank(rank)) + in_group();
    }
    return call.describe() + at_step(call.step) + " on rank " + std::to_string(rank) + " of " +
           std::to_string(world_size);
  }

  // Records the first failure; later collectives fail at once with it.
  void break_with(ErrorKind kind, const std::string& reason) {
    {
      std::lock_guard lock(mutex);
      if (broken.empty()) {
        broken = reason;
        broken_kind = kind;
      }
    }
    turn_changed.notify_all();
  }

  // Blocks until the collective issued kLanes before `call` on this rank has started.
  void wait_for_turn(const Call& call) {
    const std::size_t lane = static_cast<std::size_t>(call.sequence % kLanes);
    std::unique_lock lock(mutex);
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      if (!broken.empty()) {
        throw Error(ErrorKind::kPeerFailure,
                    where(call) + ": not started, the communicator failed earlier: " + broken);
      }
      if (next_on_lane[lane] == call.sequence) return;
      if (turn_changed.wait_until(lock, deadline) == std::cv_status::timeout &&
          next_on_lane[lane] != call.sequence && broken.empty()) {
        const std::string message =
            where(call) + ": timed out after " + timeout_text() + " waiting for collective #" +
            std::to_string(next_on_lane[lane]) +
            ", issued earlier on this rank, to start on its stream; that stream is stalled "
            "(world.timeout_s sets the limit)";
        lock.unlock();
        break_with(ErrorKind::kCommTimeout, message);
        throw Error(ErrorKind::kCommTimeout, message);
      }
    }
  }

  void pass_turn(const Call& call) {
    {
      std::lock_guard lock(mutex);
      next_on_lane[static_cast<std::size_t>(call.sequence % kLanes)] += kLanes;
    }
    turn_changed.notify_all();
  }

  std::string timeout_text() const { return seconds_text(timeout); }

  // Polls `request` until it completes. Past the deadline: a kCommTimeout naming the collective,
  // or saying `timeout_message` when one is given. `status`: where the completion's goes.
  void complete(MPI_Request& request, const Call& call, const char* what,
                const std::shared_ptr<Scratch>& scratch, const std::string& timeout_message = {},
                MPI_Status* status = MPI_STATUS_IGNORE) {
    const auto started = Clock::now();
    const auto deadline = started + timeout;
    // Note: Open MPI progresses nonblocking collectives only inside MPI calls, so the waiting
    // stream polls. It yields at first (short collectives finish within microseconds), then
    // sleeps briefly, so that waiting ranks leave the cores to ranks still computing.
    constexpr auto kSpin = std::chrono::microseconds(200);
    constexpr auto kNap = std::chrono::microseconds(20);
    for (;;) {
      int done = 0;
      const int code = MPI_Test(&request, &done, status);
      if (code != MPI_SUCCESS) fail(call, what, code);
      if (done) return;
      const auto now = Clock::now();
      if (now >= deadline) {
        const std::string message =
            !timeout_message.empty()
                ? timeout_message
                : where(call) + ": timed out after " + timeout_text() +
                      " waiting for the other ranks; a rank is stalled, failed or skipped the "
                      "collective (world.timeout_s sets the limit)";
        {
          std::lock_guard lock(mutex);
          abandoned.push_back(scratch);
        }
        break_with(ErrorKind::kCommTimeout, message);
        throw Error(ErrorKind::kCommTimeout, message);
      }
      if (now - started < kSpin) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(kNap);
      }
    }
  }

  [[noreturn]] void fail(const Call& call, const char* what, int code) {
    try {
      mpi::check(code, what, __FILE__, __LINE__);
    } catch (const Error& error) {
      const std::string message = where(call) + ": " + error.what();
      break_with(error.kind(), message);
      throw Error(error.kind(), message);
    }
    throw Error(ErrorKind::kInternal, "mpi::check accepted a failing code");
  }

  // Every rank all-gathers every rank's call; all must match. Runs on the call's lane while holding
  // its turn, so the check and the collective are started back to back on every rank.
  // Note: this costs one small all-gather's latency per collective (tens of microseconds on
  // one machine). It buys the interface's promise that a mismatch is an Error naming both
  // calls, where MPI itself would truncate, hang until the timeout, or reduce garbage.
  void check_agreement(const Call& call, const std::shared_ptr<Scratch>& scratch) {
    scratch->signature = call.signature();
    scratch->signatures.assign(static_cast<std::size_t>(world_size) * Call::kSignatureLength, 0);
    MPI_Request request = MPI_REQUEST_NULL;
    const int code =
        MPI_Iallgather(scratch->signature.data(), Call::kSignatureLength, MPI_UINT64_T,
                       scratch->signatures.data(), Call::kSignatureLength, MPI_UINT64_T,
                       lane_of(call), &request);
    if (code != MPI_SUCCESS) fail(call, "MPI_Iallgather (agreement check)", code);
    complete(request, call, "MPI_Test (agreement check)", scratch);
    const std::uint64_t* first = scratch->signatures.data();
    for (int r = 0; r < world_size; ++r) {
      const std::uint64_t* theirs = first + static_cast<std::size_t>(r) * Call::kSignatureLength;
      if (std::equal(theirs, theirs + Call::kSignatureLength, first)) continue;
      const std::string message =
          "collective mismatch: rank " + std::to_string(world_rank(0)) + " called " +
          Call::from_signature(call.sequence, first).describe() + " but rank " +
          std::to_string(world_rank(r)) + " called " +
          Call::from_signature(call.sequence, theirs).describe() + in_group() +
          "; every rank must call the same collectives in the same order";
      break_with(ErrorKind::kCommMismatch, message);
      throw Error(ErrorKind::kCommMismatch, message);
    }
  }
};

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

int checked_count(std::size_t count, const char* op) {
  if (count > static_cast<std::size_t>(INT_MAX)) {
    throw Error(ErrorKind::kUsage, std::string(op) + " of " + std::to_string(count) +
                                       " elements: the mpi backend moves at most " +
                                       std::to_string(INT_MAX) +
                                       " elements per rank in one collective (MPI's int counts)");
  }
  return static_cast<int>(count);
}

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

namespace {

// The communicators a Shared uses, each duplicated from `base` (collective over its ranks).
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

}  // namespace

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

// ---- groups ----------------------------------------------------------------------------------

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, const std::string& name,
                                                     std::chrono::milliseconds timeout) {
  if (timeout.count() < 0) throw Error(ErrorKind::kUsage, "split: the timeout must be >= 0");
  Shared& shared = *shared_;
  Call call{Op::kAllGather, shared.next_split++, 2, DType::kInt32};
  call.name = "split #" + std::to_string(call.sequence) + " ('" + name + "')";
  {
    std::lock_guard lock(shared.mutex);
    if (!shared.broken.empty()) {
      throw Error(ErrorKind::kPeerFailure,
                  shared.where(call) + ": not started, the communicator failed earlier: " +
                      shared.broken);
    }
  }
  // Note: the all-gather proves every rank has arrived, within the timeout, before the blocking
  // MPI_Comm_split; it also gives every rank the members' world ranks, for the group's errors.
  auto scratch = std::make_shared<Scratch>();
  scratch->signature[0] = static_cast<std::uint64_t>(static_cast<std::int64_t>(color < 0 ? -1 : color));
  scratch->signature[1] = static_cast<std::uint64_t>(static_cast<std::int64_t>(key));
  scratch->signatures.assign(static_cast<std::size_t>(shared.world_size) * 2, 0);
  MPI_Request request = MPI_REQUEST_NULL;
  const int code = MPI_Iallgather(scratch->signature.data(), 2, MPI_UINT64_T,
                                  scratch->signatures.data(), 2, MPI_UINT64_T, shared.control,
                                  &request);
  if (code != MPI_SUCCESS) shared.fail(call, "MPI_Iallgather (split)", code);
  shared.complete(request, call, "MPI_Test (split)", scratch,
                  shared.where(call) + ": timed out after " + shared.timeout_text() +
                      " waiting for the other ranks to call it; a rank is stalled, failed or "
                      "splits different groups (world.timeout_s sets the limit)");
  MPI_Comm comm = MPI_COMM_NULL;
  ZEST_MPI_CHECK(MPI_Comm_split(shared.control, color < 0 ? MPI_UNDEFINED : color, key, &comm));
  if (comm == MPI_COMM_NULL) return nullptr;
  const auto color_of = [&](int r) {
    return static_cast<std::int64_t>(scratch->signatures[static_cast<std::size_t>(r) * 2]);
  };
  const auto key_of = [&](int r) {
    return static_cast<std::int64_t>(scratch->signatures[static_cast<std::size_t>(r) * 2 + 1]);
  };
  std::vector<int> members;
  for (int r = 0; r < shared.world_size; ++r) {
    if (color_of(r) == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return key_of(a) < key_of(b); });
  std::vector<int> world;
  for (int r : members) world.push_back(shared.world_rank(r));
  std::shared_ptr<Shared> group;
  try {
    group = make_shared_state(comm, timeout.count() > 0 ? timeout : shared.timeout, name,
                              std::move(world));
  } catch (...) {
    MPI_Comm_free(&comm);
    throw;
  }
  MPI_Comm_free(&comm);
  return std::make_unique<MpiCommunicator>(std::move(group));
}

// ---- point to point --------------------------------------------------------------------------

namespace {

// Transfers between a pair of ranks are tagged with their running count modulo this (MPI
// guarantees tags up to 32767): a receive matches its send whatever order streams post them.
constexpr std::uint64_t kTransferTags = 32768;

}  // namespace

void MpiCommunicator::check_peer(int peer, const char* op) const {
  if (peer < 0 || peer >= world_size_) {
    throw Error(ErrorKind::kUsage, std::string(op) + " to rank " + std::to_string(peer) +
                                       ": outside a group of " + std::to_string(world_size_) +
                                       " ranks" + shared_->in_group());
  }
  if (peer == rank_) {
    throw Error(ErrorKind::kUsage, std::string(op) + " on rank " +
                                       std::to_string(shared_->world_rank(rank_)) +
                                       ": a rank cannot send to or receive from itself");
  }
}

void MpiCommunicator::send(Stream& stream, const void* data, std::size_t count, DType dtype,
                           int peer) {
  check_peer(peer, "send");
  const std::uint64_t sequence = next_send_[static_cast<std::size_t>(peer)]++;
  const int bytes = checked_count(count * dtype_size(dtype), "send (bytes)");
  Call call{Op::kBarrier, sequence, count, dtype};
  const std::string label = std::exchange(label_, {});
  call.name = describe_collective("send", sequence, count, dtype, Reduction::kSum, 0, label) +
              " to rank " + std::to_string(shared_->world_rank(peer));
  call.step = step_;
  name_.clear();
  const std::string timeout_message =
      describe_transfer("send", sequence, count, dtype, shared_->world_rank(rank_),
                        shared_->world_rank(peer), label, shared_->timeout_text()) +
      at_step(step_) + shared_->in_group() + "; rank " +
      std::to_string(shared_->world_rank(peer)) +
      " is stalled or never receives it (world.timeout_s sets the limit)";
  stream.enqueue([shared = shared_, data, bytes, peer, call, timeout_message] {
    {
      std::lock_guard lock(shared->mutex);
      if (!shared->broken.empty()) {
        throw Error(ErrorKind::kPeerFailure, shared->where(call) +
                                                 ": not started, the communicator failed "
                                                 "earlier: " + shared->broken);
      }
    }
    MPI_Request request = MPI_REQUEST_NULL;
    const int code = MPI_Isend(data, bytes, MPI_BYTE, peer,
                               static_cast<int>(call.sequence % kTransferTags),
                               shared->transfers, &request);
    if (code != MPI_SUCCESS) shared->fail(call, "MPI_Isend", code);
    shared->complete(request, call, "MPI_Test (send)", std::make_shared<Scratch>(),
                     timeout_message);
  });
}

void MpiCommunicator::receive(Stream& stream, void* data, std::size_t count, DType dtype,
                              int peer) {
  check_peer(peer, "receive");
  const std::uint64_t sequence = next_receive_[static_cast<std::size_t>(peer)]++;
  const int bytes = checked_count(count * dtype_size(dtype), "receive (bytes)");
  Call call{Op::kBarrier, sequence, count, dtype};
  const std::string label = std::exchange(label_, {});
  call.name = describe_collective("receive", sequence, count, dtype, Reduction::kSum, 0, label) +
              " from rank " + std::to_string(shared_->world_rank(peer));
  call.step = step_;
  name_.clear();
  const std::string waited =
      describe_transfer("receive", sequence, count, dtype, shared_->world_rank(rank_),
                        shared_->world_rank(peer), label, shared_->timeout_text()) +
      at_step(step_) + shared_->in_group() + "; rank " +
      std::to_string(shared_->world_rank(peer)) +
      " is stalled or never sends it (world.timeout_s sets the limit)";
  stream.enqueue([shared = shared_, data, bytes, peer, call, waited] {
    // Note: a matched probe first, so that a send of another size is a mismatch naming both
    // sizes before anything is written, where MPI_Irecv would truncate or leave bytes unwritten.
    const int tag = static_cast<int>(call.sequence % kTransferTags);
    const auto deadline = Clock::now() + shared->timeout;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    for (;;) {
      {
        std::lock_guard lock(shared->mutex);
        if (!shared->broken.empty()) {
          throw Error(ErrorKind::kPeerFailure,
                      shared->where(call) + ": the communicator failed: " + shared->broken);
        }
      }
      int found = 0;
      const int code = MPI_Improbe(peer, tag, shared->transfers, &found, &message, &status);
      if (code != MPI_SUCCESS) shared->fail(call, "MPI_Improbe", code);
      if (found) break;
      if (Clock::now() >= deadline) {
        shared->break_with(ErrorKind::kCommTimeout, waited);
        throw Error(ErrorKind::kCommTimeout, waited);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    int sent = 0;
    ZEST_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &sent));
    if (sent != bytes) {
      const std::string mismatch =
          "point-to-point mismatch" + shared->in_group() + ": rank " +
          std::to_string(shared->world_rank(peer)) + " sent " + std::to_string(sent) +
          " bytes (send #" + std::to_string(call.sequence) + ") but rank " +
          std::to_string(shared->world_rank(shared->rank)) + " receives " +
          std::to_string(bytes) + " (" + call.name +
          "); every send must pair with a receive of the same count and dtype";
      shared->break_with(ErrorKind::kCommMismatch, mismatch);
      throw Error(ErrorKind::kCommMismatch, mismatch);
    }
    MPI_Request request = MPI_REQUEST_NULL;
    const int code = MPI_Imrecv(data, bytes, MPI_BYTE, &message, &request);
    if (code != MPI_SUCCESS) shared->fail(call, "MPI_Imrecv", code);
    shared->complete(request, call, "MPI_Test (receive)", std::make_shared<Scratch>(), waited);
  });
}

}  // namespace zest
