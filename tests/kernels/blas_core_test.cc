// The OpenBLAS core choice: the rule over CPU features, CPUID read the way the kernel reads it
// (checked against Linux's /proc/cpuinfo flags, an independent reader), and that a coretype the
// user set is never overridden.
#include "kernels/blas_core.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <cblas.h>

namespace zest {
namespace {

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// The way zest-train uses it: first thing, before any product. Then OpenBLAS runs the chosen
// core, and its products are still right (against float64, at a shape that takes the packed
// kernels).
TEST(BlasCore, SelectedAtStartOpenBlasRunsThatCoreAndMultipliesRight) {
  const std::string running = select_openblas_core();
  if (const char* core = std::getenv("OPENBLAS_CORETYPE"); core != nullptr) {
    EXPECT_EQ(lower(running), lower(core));
  }
  constexpr int m = 67, n = 129, k = 300;
  std::vector<float> a(m * k), b(k * n), c(m * n, -1.0f);
  for (int i = 0; i < m * k; ++i) a[i] = static_cast<float>((i * 7) % 23) * 0.125f - 1.0f;
  for (int i = 0; i < k * n; ++i) b[i] = static_cast<float>((i * 5) % 19) * 0.25f - 2.0f;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(), n,
              0.0f, c.data(), n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double want = 0.0;
      for (int p = 0; p < k; ++p) want += double(a[i * k + p]) * double(b[p * n + j]);
      // Inputs are exact in fp32 with few bits: sums of k products, each rounding <= 2^-24
      // relative of a partial sum below 300 * 4 = 1200.
      ASSERT_NEAR(c[i * n + j], want, 1e-3) << i << ", " << j;
    }
  }
}

CpuFeatures avx512(bool bf16) {
  CpuFeatures cpu;
  cpu.avx512f = cpu.avx512bw = cpu.avx512dq = cpu.avx512vl = true;
  cpu.avx512_bf16 = bf16;
  return cpu;
}

TEST(BlasCore, AvxTwoOnlyKeepsOpenBlasOwnChoice) {
  EXPECT_EQ(preferred_openblas_core(CpuFeatures{}), nullptr);
}

TEST(BlasCore, FullAvx512AsksForSkylakeXAndWithBf16ForCooperlake) {
  EXPECT_STREQ(preferred_openblas_core(avx512(false)), "SkylakeX");
  EXPECT_STREQ(preferred_openblas_core(avx512(true)), "Cooperlake");
}

TEST(BlasCore, AnAvx512SubsetMissingKeepsOpenBlasOwnChoice) {
  // SkylakeX's kernels use BW, DQ and VL instructions besides F (Knights Landing has F only).
  for (int missing = 0; missing < 4; ++missing) {
    CpuFeatures cpu = avx512(true);
    bool* subsets[] = {&cpu.avx512f, &cpu.avx512bw, &cpu.avx512dq, &cpu.avx512vl};
    *subsets[missing] = false;
    EXPECT_EQ(preferred_openblas_core(cpu), nullptr) << missing;
  }
}

TEST(BlasCore, CpuidAgreesWithProcCpuinfo) {
  std::ifstream in("/proc/cpuinfo");
  if (!in) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string line, flags;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) {
      flags = " " + line.substr(line.find(':') + 1) + " ";
      break;
    }
  }
  if (flags.empty()) GTEST_SKIP() << "no flags line";
  const auto has = [&](const char* flag) {
    return flags.find(std::string(" ") + flag + " ") != std::string::npos;
  };
  const CpuFeatures cpu = cpu_features();
  EXPECT_EQ(cpu.avx512f, has("avx512f"));
  EXPECT_EQ(cpu.avx512bw, has("avx512bw"));
  EXPECT_EQ(cpu.avx512dq, has("avx512dq"));
  EXPECT_EQ(cpu.avx512vl, has("avx512vl"));
  EXPECT_EQ(cpu.avx512_bf16, has("avx512_bf16"));
}

TEST(BlasCore, ACoretypeTheUserSetIsKept) {
  const char* before = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved = before != nullptr ? before : "";
  setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  EXPECT_STREQ(choose_openblas_coretype(), "Haswell");
  EXPECT_STREQ(std::getenv("OPENBLAS_CORETYPE"), "Haswell");
  unsetenv("OPENBLAS_CORETYPE");
  const char* chosen = choose_openblas_coretype();
  const char* expected = preferred_openblas_core(cpu_features());
  EXPECT_EQ(chosen == nullptr, expected == nullptr);
  if (expected != nullptr) {
    EXPECT_STREQ(std::getenv("OPENBLAS_CORETYPE"), expected);
  }
  if (saved.empty()) {
    unsetenv("OPENBLAS_CORETYPE");
  } else {
    setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  }
}

TEST(BlasCore, OpenBlasNamesTheCoreItRuns) { EXPECT_FALSE(openblas_core().empty()); }

}  // namespace
}  // namespace zest
