#include "runtime/shape_communicator.h"

#include <string>
#include <utility>

#include "base/error.h"

namespace zest::shape {

ShapeCommunicator::ShapeCommunicator(int rank, int world_size, std::deque<ShapeGroup> splits)
    : rank_(rank), world_size_(world_size), splits_(std::move(splits)) {
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
  // world cannot know; the caller said it beforehand.
  if (splits_.empty()) {
    throw Error(ErrorKind::kUsage, "shape-only communicator: cannot split off " + name +
                                       "; it runs one rank, without the others' colors, and was "
                                       "told no group to answer it with");
  }
  const ShapeGroup group = splits_.front();
  splits_.pop_front();
  return std::make_unique<ShapeCommunicator>(
      group.rank, group.size, std::deque<ShapeGroup>(group.splits.begin(), group.splits.end()));
}

}  // namespace zest::shape
