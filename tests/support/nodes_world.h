// The world of the multi-node tests on one machine: `nodes` x `per_node` ranks as threads whose
// bytes inside and across nodes are counted, without waiting for a modelled link (the counts, not
// the time, are what those tests compare).
#pragma once

#include "runtime/world.h"

namespace zest::testing {

inline WorldOptions nodes_world(int nodes, int per_node) {
  WorldOptions world;
  world.ranks = nodes * per_node;
  world.ranks_per_node = per_node;
  world.link.modelled = false;
  return world;
}

}  // namespace zest::testing
