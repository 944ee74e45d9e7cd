// The thread budget of one CPU kernel call, and the split of a range over it. Ranks of the local
// backend are threads already (up to 4 on 2 cores), so the budget is process-wide, set by the
// owner of the process, and 1 by default: a kernel uses more threads only when asked (zest-train
// raises it when a single rank has the machine) and only for ranges long enough to pay for
// starting threads. Invariant: parallel_blocks returns after every piece has run.
#pragma once

#include <cstddef>
#include <functional>

namespace zest {

// Values below 1 mean 1.
void set_kernel_threads(int threads);
int kernel_threads();

// Runs body(offset, n) over [0, count) in up to kernel_threads() disjoint pieces, no more than
// leave each about `min_piece` elements (at least min_piece - kVectorBlock), one on the calling
// thread and the rest on threads started for the call. Pieces start at multiples of
// kVectorBlock (kernels/blocked_loop.h), so a piece of an aligned array is aligned. `body` must
// not throw.
void parallel_blocks(std::size_t count, std::size_t min_piece,
                     const std::function<void(std::size_t, std::size_t)>& body);

}  // namespace zest
