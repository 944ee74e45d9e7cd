// The umbrella header for programs that use zest as a library: `#include <zest/zest.h>` and link
// `zest::zest`. It includes the public header of each concept; a layer's own sources include the
// specific headers they need instead.
#pragma once

// base/: errors and element types, used by every layer.
#include "base/dtype.h"
#include "base/error.h"

// Each layer adds its public headers here as they land (runtime/, memory/, kernels/, optim/,
// models/, data/), keeping the order of the layers: lower floors first.
