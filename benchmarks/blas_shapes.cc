// The matrix products of one GPT forward+backward (the shapes models/gpt*.cc issue, as
// gpt_step_bench.cc lists them) through a BLAS chosen at run time, on one thread: to choose the
// library and OpenBLAS's kernel with numbers (benchmarks/RESULTS.md). Not part of the build
// (it is no Google Benchmark program and links no zest); compile it by hand:
//
//   g++ -O2 -std=c++20 benchmarks/blas_shapes.cc -ldl -o blas_shapes
//   OPENBLAS_CORETYPE=SkylakeX ./blas_shapes LIBRARY.so [n_layer n_embd n_head seq batch vocab]
//
// LIBRARY is anything exporting cblas_sgemm (OpenBLAS, BLIS) or oneDNN's dnnl_sgemm. Prints one
// JSON line: the step's GEMM milliseconds (median of 15 passes after 3) and GFLOP/s, and per
// shape class (block forward, block backward, attention, head).
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

enum Order { kRowMajor = 101 };
enum Trans { kNoTrans = 111, kTrans = 112 };
using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                            int, float, float*, int);
using DnnlSgemm = int (*)(char, char, std::int64_t, std::int64_t, std::int64_t, float,
                          const float*, std::int64_t, const float*, std::int64_t, float, float*,
                          std::int64_t);

struct Gemm {
  bool ta, tb;
  std::int64_t m, n, k, repeat;
  float beta;
  int kind;  // 0 block forward, 1 block backward, 2 attention, 3 head
};

std::vector<Gemm> step_gemms(std::int64_t L, std::int64_t C, std::int64_t H, std::int64_t T,
                             std::int64_t B, std::int64_t V) {
  const std::int64_t N = B * T, d = C / H, heads = B * H;
  return {{false, true, N, 3 * C, C, L, 0, 0},     {false, true, N, C, C, L, 0, 0},
          {false, true, N, 4 * C, C, L, 0, 0},     {false, true, N, C, 4 * C, L, 0, 0},
          {true, false, C, 4 * C, N, L, 1, 1},     {false, false, N, 4 * C, C, L, 0, 1},
          {true, false, 4 * C, C, N, L, 1, 1},     {false, false, N, C, 4 * C, L, 0, 1},
          {true, false, C, C, N, L, 1, 1},         {false, false, N, C, C, L, 0, 1},
          {true, false, 3 * C, C, N, L, 1, 1},     {false, false, N, C, 3 * C, L, 0, 1},
          {false, true, T, T, d, L * heads, 0, 2}, {false, false, T, d, T, L * heads, 0, 2},
          {false, true, T, T, d, L * heads, 0, 2}, {true, false, T, d, T, L * heads, 0, 2},
          {false, false, T, d, T, L * heads, 0, 2}, {true, false, T, d, T, L * heads, 0, 2},
          {false, true, N, V, C, 1, 0, 3},         {true, false, V, C, N, 1, 1, 3},
          {false, false, N, C, V, 1, 0, 3}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 8) {
    std::fprintf(stderr, "usage: blas_shapes LIBRARY.so [n_layer n_embd n_head seq batch vocab]\n");
    return 2;
  }
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    std::fprintf(stderr, "blas_shapes: %s\n", dlerror());
    return 2;
  }
  auto cblas = reinterpret_cast<CblasSgemm>(dlsym(library, "cblas_sgemm"));
  auto dnnl = reinterpret_cast<DnnlSgemm>(dlsym(library, "dnnl_sgemm"));
  if (cblas == nullptr && dnnl == nullptr) {
    std::fprintf(stderr, "blas_shapes: %s has neither cblas_sgemm nor dnnl_sgemm\n", argv[1]);
    return 2;
  }
  std::int64_t s[6] = {4, 256, 4, 128, 4, 256};
  if (argc == 8) {
    for (int i = 0; i < 6; ++i) s[i] = std::atoll(argv[i + 2]);
  }
  const std::vector<Gemm> gemms = step_gemms(s[0], s[1], s[2], s[3], s[4], s[5]);
  std::int64_t largest = 0;
  for (const Gemm& g : gemms) largest = std::max({largest, g.m * g.k, g.k * g.n, g.m * g.n});
  const auto most = static_cast<std::size_t>(largest);
  std::vector<float> a(most), b(most), c(most);
  for (std::size_t i = 0; i < most; ++i) {
    a[i] = static_cast<float>(i % 17) * 0.01f;
    b[i] = static_cast<float>(i % 13) * 0.02f;
  }
  const auto run = [&](const Gemm& g) {
    const int lda = static_cast<int>(g.ta ? g.m : g.k), ldb = static_cast<int>(g.tb ? g.k : g.n);
    if (cblas != nullptr) {
      cblas(kRowMajor, g.ta ? kTrans : kNoTrans, g.tb ? kTrans : kNoTrans, int(g.m), int(g.n),
            int(g.k), 1.0f, a.data(), lda, b.data(), ldb, g.beta, c.data(), int(g.n));
    } else {
      dnnl(g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb,
           g.beta, c.data(), g.n);
    }
  };
  double kind_ms[4] = {}, kind_flops[4] = {}, flops = 0.0;
  std::vector<double> passes;
  for (int pass = 0; pass < 18; ++pass) {
    double pass_ms = 0.0;
    for (const Gemm& g : gemms) {
      const auto begin = std::chrono::steady_clock::now();
      for (std::int64_t r = 0; r < g.repeat; ++r) run(g);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin)
              .count();
      pass_ms += ms;
      if (pass >= 3) {
        kind_ms[g.kind] += ms / 15.0;
        if (pass == 3) kind_flops[g.kind] += 2.0 * g.m * g.n * g.k * g.repeat;
      }
      if (pass == 3) flops += 2.0 * g.m * g.n * g.k * g.repeat;
    }
    if (pass >= 3) passes.push_back(pass_ms);
  }
  std::sort(passes.begin(), passes.end());
  const double median = passes[passes.size() / 2];
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf("{\"library\": \"%s\", \"coretype\": \"%s\", \"step_gemm_ms\": %.3f, "
              "\"GFLOPs\": %.1f, \"gflops_fwd\": %.1f, \"gflops_bwd\": %.1f, "
              "\"gflops_attn\": %.1f, \"gflops_head\": %.1f}\n",
              argv[1], coretype ? coretype : "", median, flops / median / 1e6,
              kind_flops[0] / kind_ms[0] / 1e6, kind_flops[1] / kind_ms[1] / 1e6,
              kind_flops[2] / kind_ms[2] / 1e6, kind_flops[3] / kind_ms[3] / 1e6);
  return 0;
}
