// What an allocation is for. Every byte a device hands out is charged to one category, so the
// measured peak can be held against the memory table (docs/architecture.md) line by line.
#pragma once

#include <array>
#include <cstddef>
#include <string>

namespace zest {

enum class Category {
  kParams,       // parameters as the model computes with them (shards, or full at stages 0-2)
  kGrads,        // gradients (full or shard)
  kOptimizer,    // fp32 master weights and optimizer moments
  kGather,       // ZeRO-3 buffers that hold a unit's gathered parameters
  kSecondary,    // ZeRO-3 with hpZ: each unit's secondary shard, partitioned within a node
  kBuckets,      // gradient reduction buckets
  kActivations,  // what forward keeps for backward
  kWorkspace,    // scratch that lives within one operation
  kOffload,      // in host memory: an offloaded optimizer's master weights, moments, transfers
  kSnapshot,     // in host memory: an asynchronous checkpoint's snapshot buffers
};

inline constexpr std::size_t kCategoryCount = 10;

const char* category_name(Category category);
// The categories charged in the host arena, never on the device: `offload` and `snapshot`.
bool in_host_memory(Category category);
// All categories in declaration order, for loops and reports.
const std::array<Category, kCategoryCount>& all_categories();

}  // namespace zest
