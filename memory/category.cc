#include "memory/category.h"

namespace zest {

const char* category_name(Category category) {
  switch (category) {
    case Category::kParams: return "params";
    case Category::kGrads: return "grads";
    case Category::kOptimizer: return "optimizer";
    case Category::kGather: return "gather";
    case Category::kSecondary: return "secondary";
    case Category::kBuckets: return "buckets";
    case Category::kActivations: return "activations";
    case Category::kWorkspace: return "workspace";
    case Category::kOffload: return "offload";
    case Category::kSnapshot: return "snapshot";
  }
  return "unknown";
}

bool in_host_memory(Category category) {
  return category == Category::kOffload || category == Category::kSnapshot;
}

const std::array<Category, kCategoryCount>& all_categories() {
  static const std::array<Category, kCategoryCount> categories = {
      Category::kParams,      Category::kGrads,     Category::kOptimizer,
      Category::kGather,      Category::kSecondary, Category::kBuckets,
      Category::kActivations, Category::kWorkspace, Category::kOffload,
      Category::kSnapshot};
  return categories;
}

}  // namespace zest
