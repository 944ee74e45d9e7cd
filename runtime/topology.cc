#include "runtime/topology.h"

#include <set>

#include <fmt/format.h>

#include "base/error.h"

namespace zest {

Topology::Topology(int world_size, int ranks_per_node) {
  if (ranks_per_node < 1) {
    throw Error(ErrorKind::kConfig,
                fmt::format("world.ranks_per_node: must be >= 1, got {}", ranks_per_node));
  }
  if (world_size < 1 || world_size % ranks_per_node != 0) {
    std::vector<int> divisors;
    for (int d = 1; d <= world_size; ++d) {
      if (world_size % d == 0) divisors.push_back(d);
    }
    throw Error(ErrorKind::kConfig,
                fmt::format("world.ranks_per_node: {} does not divide world.ranks {}; every node "
                            "runs the same number of ranks (one of: {})",
                            ranks_per_node, world_size, fmt::join(divisors, ", ")));
  }
  world_size_ = world_size;
  ranks_per_node_ = ranks_per_node;
}

int Topology::nodes_spanned(const std::vector<int>& world_ranks) const {
  std::set<int> nodes;
  for (int rank : world_ranks) nodes.insert(node_of(rank));
  return static_cast<int>(nodes.size());
}

std::string Topology::describe() const {
  return fmt::format("{} node{} x {} rank{}", nodes(), nodes() == 1 ? "" : "s", ranks_per_node_,
                     ranks_per_node_ == 1 ? "" : "s");
}

}  // namespace zest
