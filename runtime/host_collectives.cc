#include "runtime/host_collectives.h"

#include "runtime/host_copies.h"
#include "runtime/release_after.h"

namespace zest {

namespace {

bool host_is_device(const RankContext& context) {
  return context.device.kind() == DeviceKind::kCpu;
}

// Device memory for `bytes` of staged values, charged to workspace (a few bytes a step).
Buffer staging(const RankContext& context, std::size_t bytes) {
  return context.allocator().allocate(bytes, Category::kWorkspace);
}

}  // namespace

void all_reduce_host(const RankContext& context, const void* send, void* receive,
                     std::size_t count, DType dtype, Reduction reduction) {
  Stream& comm = context.comm;
  if (host_is_device(context)) {
    context.communicator.all_reduce(comm, send, receive, count, dtype, reduction);
    comm.synchronize();
    return;
  }
  const std::size_t bytes = count * dtype_size(dtype);
  Buffer staged = staging(context, bytes);
  write_from_host(context.device, comm, staged.data(), send, bytes);
  context.communicator.all_reduce(comm, staged.data(), staged.data(), count, dtype, reduction);
  read_to_host(context.device, comm, receive, staged.data(), bytes);
}

namespace {

// The context's device and streams, `group`'s ranks.
RankContext over(const RankContext& context, Communicator& group) {
  return RankContext{group.rank(),    group.world_size(), context.device,
                     context.compute, context.comm,       context.prefetch,
                     group,           context.trace,      context.topology,
                     context.wire,    context.replicas,   context.rank_in_world()};
}

}  // namespace

void all_reduce_host(const RankContext& context, Communicator& group, const void* send,
                     void* receive, std::size_t count, DType dtype, Reduction reduction) {
  all_reduce_host(over(context, group), send, receive, count, dtype, reduction);
}

void all_gather_host(const RankContext& context, Communicator& group, const void* send,
                     void* receive, std::size_t count, DType dtype) {
  all_gather_host(over(context, group), send, receive, count, dtype);
}

void all_gather_host(const RankContext& context, const void* send, void* receive,
                     std::size_t count, DType dtype) {
  Stream& comm = context.comm;
  if (host_is_device(context)) {
    context.communicator.all_gather(comm, send, receive, count, dtype);
    comm.synchronize();
    return;
  }
  const std::size_t bytes = count * dtype_size(dtype);
  const std::size_t total = bytes * static_cast<std::size_t>(context.world_size);
  Buffer staged = staging(context, total);
  char* mine = staged.as<char>() + static_cast<std::size_t>(context.rank) * bytes;
  write_from_host(context.device, comm, mine, send, bytes);
  context.communicator.all_gather(comm, mine, staged.data(), count, dtype);
  read_to_host(context.device, comm, receive, staged.data(), total);
}

void broadcast_host(const RankContext& context, void* values, std::size_t count, DType dtype,
                    int root) {
  Stream& comm = context.comm;
  if (host_is_device(context)) {
    context.communicator.broadcast(comm, values, count, dtype, root);
    comm.synchronize();
    return;
  }
  const std::size_t bytes = count * dtype_size(dtype);
  Buffer staged = staging(context, bytes);
  write_from_host(context.device, comm, staged.data(), values, bytes);
  context.communicator.broadcast(comm, staged.data(), count, dtype, root);
  read_to_host(context.device, comm, values, staged.data(), bytes);
}

}  // namespace zest
