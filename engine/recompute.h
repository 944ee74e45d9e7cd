// Activation recomputation (activation_checkpointing): which units drop what they would keep
// from forward to backward and rebuild it before their backward. Full: the unit keeps nothing
// but its input (the previous unit's output, which the engine keeps anyway), and the engine runs
// its forward again inside its backward call. Selective: the unit keeps its matrix products and
// drops the cheap, large rest (Unit::supports_selective_recompute), which Unit::recompute rebuilds.
// The engine and the memory planner both decide here, so the plan follows the engine exactly.
// Invariant: the last unit is never recomputed (its backward follows its forward at once).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace zest {

enum class RecomputePolicy { kNone, kSelective, kFull };

const char* recompute_policy_name(RecomputePolicy policy);  // "none", "selective", "full"

// activation_checkpointing: the policy, the units it names and where the kept inputs wait.
struct ActivationCheckpointing {
  RecomputePolicy policy = RecomputePolicy::kNone;
  // Units in forward order: every `every`-th (units every-1, 2·every-1, ...), among the first
  // `first` (0: all of them).
  std::size_t every = 1;
  std::size_t first = 0;
  // cpu_checkpointing: a recomputed unit's input waits in the host arena (category offload)
  // from its forward to its backward instead of in device memory.
  bool cpu_checkpointing = false;

  bool enabled() const { return policy != RecomputePolicy::kNone; }
  // Whether the unit list names unit `index` (the policy aside).
  bool names(std::size_t index) const {
    return (first == 0 || index < first) && every > 0 && (index + 1) % every == 0;
  }
};

// What a unit allows. Note: a unit whose gradients may replace its parameters in the gather slot
// (Unit::gradients_replace_parameters: the GPT's embedding) is never recomputed, since its
// recomputed forward would run after a borrower's backward has made that slot its gradient; such
// a unit keeps nothing from forward anyway.
struct Recomputable {
  bool full = true;        // !Unit::gradients_replace_parameters()
  bool selective = false;  // Unit::supports_selective_recompute()
};

class Unit;  // engine/module.h

// What each of `units` allows, from its own declarations.
std::vector<Recomputable> recomputable_of(const std::vector<Unit*>& units);

// Per unit, what the engine does: kNone, kSelective (forward keeps its selective part, the engine
// calls recompute() before backward) or kFull. Throws a kConfig Error naming the key when the
// options name no unit that the policy can recompute (a unit list beyond the model, a selective
// policy for a model none of whose named units can recompute selectively).
std::vector<RecomputePolicy> plan_recompute(const ActivationCheckpointing& options,
                                            const std::vector<Recomputable>& units);

// `given` (EngineOptions::recompute_plan) when it is not empty, else plan_recompute over what
// `units` allow. A kUsage Error when `given` has not one entry per unit.
std::vector<RecomputePolicy> given_or_planned(const ActivationCheckpointing& options,
                                              const std::vector<RecomputePolicy>& given,
                                              const std::vector<Unit*>& units);

// On a device whose frees wait for the stream (the CPU device's arena), the host would charge
// every unit's transient activations at once, since it enqueues a whole forward before the
// stream has run the first unit. So before a recomputed unit's call the host waits until the
// stream has finished the recomputed call this many calls back: with 1, no two recomputed
// calls' transients coexist. Note: the stream idles only while the host enqueues one call (tens
// of microseconds against the milliseconds a unit computes); a CUDA device, whose pool frees in
// stream order, never waits.
inline constexpr std::size_t kRecomputeLag = 1;

}  // namespace zest
