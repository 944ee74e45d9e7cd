// What one unit allocates for one micro-batch besides the model state, as the memory planner
// (planner/peak_plan.h) needs it. A model computes these from the same helpers its forward and
// backward allocate with, so the plan and the allocations cannot drift apart.
// Invariant: bytes as asked of the allocator (unrounded), all fp32 activations and scratch.
#pragma once

#include <cstddef>

namespace zest {

struct UnitMemory {
  std::size_t output = 0;              // make_output in forward (activations; freed by the engine
                                       // after this unit's backward)
  std::size_t saved = 0;               // kept from forward for backward (activations)
  // The unit whose backward frees `saved` when it is not this unit's own (-1): a tied head whose
  // gradient product earlier units finish (models/gpt_pieces.h).
  int saved_freed_by = -1;
  std::size_t forward_workspace = 0;   // scratch of one forward call (workspace)
  std::size_t grad_input = 0;          // make_grad_input in backward (activations; freed after
                                       // the previous unit's backward)
  std::size_t backward_workspace = 0;  // scratch of one backward call (workspace)
  // The part of backward_workspace a CUDA device does not ask for: scratch whose CUDA body takes
  // its own from the stream (attention's, inside backward_stream_scratch below).
  std::size_t backward_workspace_cpu_only = 0;
  // On a CUDA device, what the unit's forward / backward ask of the compute stream's own
  // scratch (CudaStream::workspace: kept between calls, grown to the largest ask, charged to
  // workspace): the products' cuBLASLt workspace, attention's backward scratch.
  std::size_t forward_stream_scratch = 0;
  std::size_t backward_stream_scratch = 0;

  // Selective recomputation (Unit::supports_selective_recompute): with it, forward keeps
  // selective_saved instead of saved and drops selective_rebuilt when its forward is done
  // (both activations, both allocated in that order before the forward workspace, which is then
  // selective_forward_workspace); before backward, recompute() allocates selective_rebuilt again
  // and rebuild_workspace (workspace, freed when recompute() is done).
  bool selective = false;
  std::size_t selective_saved = 0;
  std::size_t selective_rebuilt = 0;
  std::size_t selective_forward_workspace = 0;
  std::size_t rebuild_workspace = 0;
  std::size_t rebuild_stream_scratch = 0;

  // Split backward (Unit::supports_split_backward): backward_input allocates its input gradient
  // and keeps for backward_weight split_kept bytes and, with split_keeps_workspace, its backward
  // workspace (all activations); backward_weight allocates nothing and frees them with saved.
  bool split_backward = false;
  bool split_keeps_workspace = false;
  std::size_t split_kept = 0;
};

}  // namespace zest
