// The units the activation-checkpointing policy recomputes, by name, for the resolved config:
// the engine plans them itself from the same options (engine/recompute.h: plan_recompute), so
// this is what the user reads, never what the engine reads.
#pragma once

#include "config/train_config.h"

namespace zest {

// Writes activation_checkpointing.recomputed to config.json: the names of the units the policy
// recomputes, in model order; empty without a policy, and for a model of more units than the
// tools build (whose names would take its size in memory).
void resolve_recomputed_units(TrainConfig& config);

}  // namespace zest
