// Builds the batch source a config's `data` block names (data/batch_source.h), reading and
// checking its files once, before any rank starts: a bad file is one clear kData Error before
// training, never a failure in the middle of it. The source is shared, read-only, by every rank
// of the process.
#pragma once

#include <memory>

#include "data/batch_source.h"
#include "config/train_config.h"

namespace zest {

std::unique_ptr<BatchSource> make_batch_source(const TrainConfig& config);

}  // namespace zest
