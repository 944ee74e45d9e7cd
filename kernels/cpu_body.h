// Which instruction-set body a CPU kernel with several runs: the portable C++ loop, or (x86-64
// builds) hand-vectorized AVX2 or AVX-512 code, chosen once per process at run time from what the
// CPU supports. The environment variable ZEST_CPU_KERNEL=portable|avx2|avx512 forces one (for
// tests and benchmarks); asking for a body this CPU or build lacks is a kConfig Error.
// Invariant: every body of a kernel computes the same fp32 results as its portable body.
#pragma once

namespace zest {

enum class CpuBody { kPortable, kAvx2, kAvx512 };

// "portable", "avx2", "avx512".
const char* cpu_body_name(CpuBody body);

// Whether this build has the body and this CPU can run it (the portable body always).
bool cpu_body_supported(CpuBody body);

// The body for `requested` (a ZEST_CPU_KERNEL value; null or empty: the widest supported).
// Throws a kConfig Error naming ZEST_CPU_KERNEL for an unknown or unsupported name.
CpuBody choose_cpu_body(const char* requested);

// choose_cpu_body(getenv("ZEST_CPU_KERNEL")), decided on the first call and kept.
CpuBody selected_cpu_body();

}  // namespace zest
