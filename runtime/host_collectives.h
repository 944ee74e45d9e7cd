// Collectives over a few host values — a loss, a gradient norm, a flag, a checkpoint's phase
// records — for code that holds them on the host. The communicator's buffers are device memory
// (NCCL reads nothing else), so on a device whose memory is not host memory these stage the
// values through a small device buffer on the rank's comm stream; on the CPU device they are
// the plain collective. Each call returns once the result is in `receive` (it synchronizes the
// comm stream) and throws that stream's failure. Label the collective with
// context.communicator.label_next() first, as for any other.
#pragma once

#include <cstddef>

#include "base/dtype.h"
#include "runtime/communicator.h"
#include "runtime/world.h"

namespace zest {

// receive[0, count) = the reduction over ranks of send[0, count); in place when send == receive.
void all_reduce_host(const RankContext& context, const void* send, void* receive,
                     std::size_t count, DType dtype, Reduction reduction);
// The same over `group`, a communicator split from the context's world (a tensor-parallel group):
// the context's device and comm stream carry it, `group`'s ranks reduce.
void all_reduce_host(const RankContext& context, Communicator& group, const void* send,
                     void* receive, std::size_t count, DType dtype, Reduction reduction);

// receive holds world_size × count elements; rank r's send lands at receive + r × count.
void all_gather_host(const RankContext& context, const void* send, void* receive,
                     std::size_t count, DType dtype);
// The same over `group`, as all_reduce_host's overload: receive holds group.world_size() × count.
void all_gather_host(const RankContext& context, Communicator& group, const void* send,
                     void* receive, std::size_t count, DType dtype);

// Every rank's `values` becomes root's.
void broadcast_host(const RankContext& context, void* values, std::size_t count, DType dtype,
                    int root);

}  // namespace zest
