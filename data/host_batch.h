// A Batch and the host memory behind it. The CPU device reads host memory directly; a CUDA
// device needs the batch copied to the device first. Move-only, because the Batch's views point
// into the vectors (a move keeps their storage, a copy would not).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/module.h"

namespace zest {

class HostBatch {
 public:
  // Classification: inputs float [rows, features], targets int32 class ids [rows].
  static HostBatch features(std::vector<float> inputs, std::vector<std::int32_t> targets,
                            std::int64_t features);
  // Language modelling: inputs int32 tokens [rows, seq_len], targets the next tokens, same shape.
  static HostBatch tokens(std::vector<std::int32_t> inputs, std::vector<std::int32_t> targets,
                          std::int64_t rows, std::int64_t seq_len);

  HostBatch(HostBatch&&) noexcept = default;
  HostBatch& operator=(HostBatch&&) noexcept = default;
  HostBatch(const HostBatch&) = delete;
  HostBatch& operator=(const HostBatch&) = delete;

  // Valid while this HostBatch lives: keep it until the engine's stream has passed its use
  // (Trainer::step() and Trainer::evaluate() synchronize).
  const Batch& batch() const { return batch_; }
  std::int64_t rows() const { return batch_.targets.shape.empty() ? 0 : batch_.targets.shape[0]; }

 private:
  HostBatch() = default;

  std::vector<float> float_inputs_;
  std::vector<std::int32_t> token_inputs_;
  std::vector<std::int32_t> targets_;
  Batch batch_;
};

}  // namespace zest
