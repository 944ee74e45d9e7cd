// Which OpenBLAS kernel family ("core") runs the CPU's matrix products, and the one to ask for.
// OpenBLAS picks by the processor it recognises; one newer than the library falls back to an
// older family: Debian's 0.3.21 runs its Haswell (AVX2) kernels on AMD Zen 4, which has
// AVX-512, and there its SkylakeX kernels run the GPT's products 1.8x faster (RESULTS.md).
// OpenBLAS reads OPENBLAS_CORETYPE while the dynamic loader initializes it, before main, and
// glibc rebuilds the environment after .preinit_array, so a program calls select_openblas_core()
// at the top of main instead: it asks OpenBLAS to pick again (its DYNAMIC_ARCH builds export
// that). Invariant: an OPENBLAS_CORETYPE already in the environment is kept.
#pragma once

#include <string>

namespace zest {

// What the choice depends on: CPUID's AVX-512 subsets, each only where the OS saves the
// AVX-512 registers (XCR0), as OpenBLAS's own kernels require.
struct CpuFeatures {
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512_bf16 = false;
};

// Read from CPUID (all false off x86-64). Safe before any library is initialized.
CpuFeatures cpu_features();

// "Cooperlake" (AVX-512 F, BW, DQ, VL and BF16: SkylakeX's fp32 kernels plus bf16 ones),
// "SkylakeX" (the four), or nullptr: leave OpenBLAS's own choice.
const char* preferred_openblas_core(const CpuFeatures& cpu);

// Sets OPENBLAS_CORETYPE to preferred_openblas_core(cpu_features()) unless the environment has
// it already; returns the value in force afterwards (nullptr: none). Calls nothing of OpenBLAS;
// a child process started afterwards inherits the choice.
const char* choose_openblas_coretype();

// choose_openblas_coretype(), then, where that changed the variable and this OpenBLAS can pick
// its core again, has it do so; returns openblas_core() afterwards. Call it once, first thing in
// main: before any matrix product and before any thread that might run one.
std::string select_openblas_core();

// The family OpenBLAS is running ("Haswell", "SkylakeX", ...), or "unknown".
std::string openblas_core();

}  // namespace zest
