// ctest-labels: gpu
// Activation recomputation on the CUDA device: the GPT with full and selective recomputation and
// with the kept inputs offloaded to pinned host memory (the checkpoint copy stream) ends with
// the same losses and parameters, bit for bit, as the same run on the GPU without them, at
// stages 0 and 3, fp32 and bf16, with gradient accumulation, on one GPU (and two where two are
// visible). The CUDA kernels are deterministic for a fixed shape, so any difference is a bug of
// the recomputation, as on the CPU (tests/engine/recompute_test.cc). Skips, saying why, where no
// GPU is visible.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "tests/engine/recompute_test_support.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

using testing::Job;
using testing::policy;

TEST(RecomputeCuda, EveryPolicyChangesNoBitOnTheGpu) {
  ZEST_SKIP_WITHOUT_CUDA();
  const int gpus = cuda::visible_devices().count;
  for (const int world : {1, 2}) {
    if (world > gpus) continue;
    for (const int stage : {0, 3}) {
      for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        Job plain{stage, world, dtype, /*accumulation=*/2, {}, false};
        plain.device = DeviceKind::kCuda;
        const testing::Training want = testing::run_gpt(plain);
        for (const auto& [name, checkpointing] :
             {std::pair{"full", policy(RecomputePolicy::kFull)},
              std::pair{"selective", policy(RecomputePolicy::kSelective)},
              std::pair{"full + cpu_checkpointing", policy(RecomputePolicy::kFull, true)}}) {
          Job job = plain;
          job.checkpointing = checkpointing;
          SCOPED_TRACE(testing::describe(job) + " (" + name + ")");
          testing::expect_bit_identical(want, testing::run_gpt(job));
        }
      }
    }
  }
}

}  // namespace
}  // namespace zest
