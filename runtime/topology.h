// Which node each rank runs on: `world.ranks_per_node` consecutive ranks share a node, as
// launchers number a node's processes (Open MPI's and Slurm's default block mapping, torchrun).
// The link model (link_model.h) and hybrid sharding read it; nothing else changes with it.
// Invariant: the nodes are equal, ranks_per_node divides the world size (else one kConfig line).
#pragma once

#include <string>
#include <vector>

namespace zest {

class Topology {
 public:
  Topology() = default;  // one rank on one node
  // A kConfig Error, one line naming world.ranks_per_node and world.ranks, when ranks_per_node
  // is < 1 or does not divide world_size.
  Topology(int world_size, int ranks_per_node);

  int world_size() const { return world_size_; }
  int ranks_per_node() const { return ranks_per_node_; }
  int nodes() const { return world_size_ / ranks_per_node_; }
  int node_of(int world_rank) const { return world_rank / ranks_per_node_; }
  // How many different nodes hold these world ranks.
  int nodes_spanned(const std::vector<int>& world_ranks) const;
  // "2 nodes x 2 ranks" ("1 node x 4 ranks").
  std::string describe() const;

 private:
  int world_size_ = 1;
  int ranks_per_node_ = 1;
};

}  // namespace zest
