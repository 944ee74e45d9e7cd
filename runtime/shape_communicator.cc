#include "runtime/shape_communicator.h"

#include <string>

#include "base/error.h"

namespace zest::shape {

ShapeCommunicator::ShapeCommunicator(int rank, int world_size)
    : rank_(rank), world_size_(world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw Error(ErrorKind::kUsage, "shape-only communicator: rank " + std::to_string(rank) +
                                       " of " + std::to_string(world_size));
  }
}

std::unique_ptr<Communicator> ShapeCommunicator::split(int color, int key,
                                                       const std::string& name,
                                                       std::chrono::milliseconds timeout) {
  (void)color;
  (void)key;
  (void)timeout;
  // Note: a group's size depends on every rank's color, which one rank standing in for the
  // world cannot know.
  throw Error(ErrorKind::kUsage, "shape-only communicator: cannot split off " + name +
                                     "; it runs one rank, without the others' colors");
}

}  // namespace zest::shape
