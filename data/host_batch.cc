#include "data/host_batch.h"

#include <utility>

namespace zest {

HostBatch HostBatch::features(std::vector<float> inputs, std::vector<std::int32_t> targets,
                              std::int64_t features) {
  HostBatch made;
  made.float_inputs_ = std::move(inputs);
  made.targets_ = std::move(targets);
  const auto rows = static_cast<std::int64_t>(made.targets_.size());
  made.batch_.inputs = Tensor{made.float_inputs_.data(), {rows, features}, DType::kFloat32};
  made.batch_.targets = Tensor{made.targets_.data(), {rows}, DType::kInt32};
  return made;
}

HostBatch HostBatch::tokens(std::vector<std::int32_t> inputs, std::vector<std::int32_t> targets,
                            std::int64_t rows, std::int64_t seq_len) {
  HostBatch made;
  made.token_inputs_ = std::move(inputs);
  made.targets_ = std::move(targets);
  made.batch_.inputs = Tensor{made.token_inputs_.data(), {rows, seq_len}, DType::kInt32};
  made.batch_.targets = Tensor{made.targets_.data(), {rows, seq_len}, DType::kInt32};
  return made;
}

}  // namespace zest
