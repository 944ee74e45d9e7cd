#include "kernels/matmul.h"

#include <cblas.h>

#if defined(__linux__)
#include <sched.h>
#endif

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <string>

#include "base/error.h"
#include "kernels/dispatch.h"
#include "runtime/core_pinning.h"

#if ZEST_HAVE_CUDA
#include "base/cuda_check.h"
#include "kernels/matmul_cuda.h"
#include "kernels/scale_cuda.h"
#include "runtime/cuda_stream.h"
#endif

namespace zest {
namespace {

void check_dimension(const char* name, std::int64_t value) {
  // Note: OpenBLAS's cblas takes 32-bit ints (blasint) unless built for 64-bit indices.
  if (value < 0 || value > INT_MAX) {
    throw Error(ErrorKind::kUsage, std::string("matmul: ") + name + " must be in [0, 2^31), got " +
                                       std::to_string(value));
  }
}

void check_dimensions(std::int64_t m, std::int64_t n, std::int64_t k) {
  check_dimension("m", m);
  check_dimension("n", n);
  check_dimension("k", k);
}

// The stored row lengths of A, B and C, as row-major matrices.
struct RowLengths {
  std::int64_t a, b, c;
};
RowLengths row_lengths(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                       std::int64_t k) {
  return {trans_a ? m : k, trans_b ? k : n, n};
}

void check_leading(const char* name, std::int64_t ld, std::int64_t row_length) {
  if (ld < std::max<std::int64_t>(row_length, 1) || ld > INT_MAX) {
    throw Error(ErrorKind::kUsage, std::string("matmul: ") + name + " must be in [" +
                                       std::to_string(std::max<std::int64_t>(row_length, 1)) +
                                       ", 2^31), got " + std::to_string(ld));
  }
}

void check_leading_dimensions(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                              std::int64_t k, std::int64_t lda, std::int64_t ldb,
                              std::int64_t ldc) {
  check_dimensions(m, n, k);
  const RowLengths rows = row_lengths(trans_a, trans_b, m, n, k);
  check_leading("lda", lda, rows.a);
  check_leading("ldb", ldb, rows.b);
  check_leading("ldc", ldc, rows.c);
}

#if ZEST_HAVE_CUDA
void scale_empty_product(cuda::CudaStream& stream, std::int64_t count, float beta, float* c) {
  if (beta == 1.0f) return;
  const auto elements = static_cast<std::size_t>(count);
  if (beta == 0.0f) {
    ZEST_CUDA_CHECK(cudaMemsetAsync(c, 0, elements * sizeof(float), stream.handle()));
    return;
  }
  cuda::scale(c, elements, beta, stream.handle());
}
#endif

// Note: ranks that are threads of one process each run their products on their own thread, and
// four ranks on two cores made the kernel time-slice four products at once: each is interrupted
// every few milliseconds and finds its packed panels evicted from the cache by the others. At
// most as many products as the process may use cores run at once (ZEST_CONCURRENT_PRODUCTS=n
// sets another number, 0 none); a rank that would be one more waits, asleep, for a product to
// finish. A product never waits for anything else while it runs, so this cannot deadlock. Only
// products of at least kGatedProductWork multiply-adds (about 0.1 ms) pass the gate: a small
// one finishes within its time slice anyway, and waking a thread that slept at the gate costs
// tens of microseconds, as much as the product.
class ProductGate {
 public:
  ProductGate() : permits_(initial_permits()) {}
  explicit ProductGate(int permits) : permits_(permits) {}

  // Whether ZEST_CONCURRENT_PRODUCTS set the number: it then holds for the process, pinned or not.
  static bool set_by_environment() { return std::getenv("ZEST_CONCURRENT_PRODUCTS") != nullptr; }

  // Returns whether the caller holds a permit, to give back with leave().
  bool enter() {
    if (permits_ <= 0) return false;
    std::unique_lock lock(mutex_);
    free_.wait(lock, [&] { return running_ < permits_; });
    ++running_;
    return true;
  }
  void leave() {
    {
      std::lock_guard lock(mutex_);
      --running_;
    }
    free_.notify_one();
  }

 private:
  static int initial_permits() {
    if (const char* value = std::getenv("ZEST_CONCURRENT_PRODUCTS"); value != nullptr) {
      return std::atoi(value);
    }
#if defined(__linux__)
    cpu_set_t cores;
    if (sched_getaffinity(0, sizeof(cores), &cores) == 0) return std::max(1, CPU_COUNT(&cores));
#endif
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }

  const int permits_;
  int running_ = 0;
  std::mutex mutex_;
  std::condition_variable free_;
};

constexpr std::int64_t kGatedProductWork = std::int64_t{1} << 22;

// Note: ranks pinned to cores (runtime/core_pinning.h) pass a gate of their core's, which lets
// one product run at a time: a process-wide gate of n permits could let two ranks of one core
// multiply while the other core's ranks wait at the gate, leaving that core idle. A thread bound
// to one core for another reason (taskset -c 0) gets the same: one product at a time there.
ProductGate& product_gate() {
  static ProductGate gate;
  thread_local ProductGate* mine = [] {
    const int core = this_thread_core();
    if (core < 0 || ProductGate::set_by_environment()) return &gate;
    static std::mutex mutex;
    static std::map<int, std::unique_ptr<ProductGate>> per_core;
    std::lock_guard lock(mutex);
    auto& slot = per_core[core];
    if (slot == nullptr) slot = std::make_unique<ProductGate>(1);
    return slot.get();
  }();
  return *mine;
}

// Note: a thread bound to one core multiplies on that core alone. Pinned ranks outnumber the
// cores (runtime/core_pinning.h), so OpenBLAS's pool could only put a product's other half on a
// core other ranks keep busy: the first product of a pinned thread sets the process's OpenBLAS
// to one thread a product, as zest-train does for any world of several ranks (a planner suite of
// 4 pinned ranks ran 35 s with the pool, 20 s without). Process-wide, and kept: OpenBLAS 0.3.21
// has no per-call setting.
void single_threaded_blas_when_pinned() {
  if (this_thread_core() < 0) return;
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// Note: OpenBLAS packs op(A)'s rows (its column-major "N") in panels of up to GEMM_R, which fills
// each thread's 128 MiB buffer: a product with 50257 rows (the tied embedding's gradient) made
// every OpenBLAS thread touch about 25 MiB of it for good. Products of more rows run as several
// products of kMaxProductRows rows, which touch a few MiB and compute every element of C with
// the same blocking of k, so the same bits.
constexpr std::int64_t kMaxProductRows = 2048;

}  // namespace

namespace cpu {

void matmul(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
            const float* a, const float* b, float beta, float* c) {
  check_dimensions(m, n, k);
  if (m == 0 || n == 0) return;
  single_threaded_blas_when_pinned();
  // Leading dimensions of the stored (untransposed) row-major matrices.
  const int lda = static_cast<int>(trans_a ? m : k);
  const int ldb = static_cast<int>(trans_b ? k : n);
  const std::int64_t rows = m > kMaxProductRows ? kMaxProductRows : m;
  for (std::int64_t first = 0; first < m; first += rows) {
    const std::int64_t count = std::min(rows, m - first);
    const float* a_rows = trans_a ? a + first : a + first * k;
    const bool gated = count * n * k >= kGatedProductWork && product_gate().enter();
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(count), static_cast<int>(n),
                static_cast<int>(k), alpha, a_rows, lda > 0 ? lda : 1, b, ldb > 0 ? ldb : 1, beta,
                c + first * n, static_cast<int>(n));
    if (gated) product_gate().leave();
  }
}

void matmul_ld(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
               float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
               float beta, float* c, std::int64_t ldc) {
  check_leading_dimensions(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  single_threaded_blas_when_pinned();
  // Note: through the same gate as matmul's products (not cut in row pieces: the vocabulary
  // pieces' products are a few hundred rows).
  const bool gated = m * n * k >= kGatedProductWork && product_gate().enter();
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
  if (gated) product_gate().leave();
}

}  // namespace cpu

void set_fp32_matmul_rounding(Stream& stream, DType rounding) {
  if (rounding != DType::kFloat32 && rounding != DType::kBFloat16 &&
      rounding != DType::kFloat16) {
    throw Error(ErrorKind::kUsage, std::string("set_fp32_matmul_rounding: ") +
                                       dtype_name(rounding) + " is not fp32, bf16 or fp16");
  }
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::cuda_stream(stream, "set_fp32_matmul_rounding").set_fp32_matmul_rounding(rounding);
    return;
  }
#endif
  if (stream.device_kind() != DeviceKind::kCpu) {
    throw Error(ErrorKind::kUsage, "set_fp32_matmul_rounding: no CUDA body yet");
  }
  // The CPU device multiplies exactly: nothing to set.
}

void matmul(Stream& stream, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
            std::int64_t k, float alpha, const float* a, const float* b, float beta, float* c) {
  check_dimensions(m, n, k);
  if (m == 0 || n == 0) return;
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::CudaStream& cuda = cuda::cuda_stream(stream, "matmul");
    if (k == 0) {
      // An empty sum (an MLP's weight gradient over zero rows): C = beta·C, as BLAS, which
      // cuBLASLt refuses to compute. beta 0 writes zeros whatever C held (a NaN included).
      scale_empty_product(cuda, m * n, beta, c);
      return;
    }
    cuda::MatmulArgs args;
    args.trans_a = trans_a;
    args.trans_b = trans_b;
    args.m = m;
    args.n = n;
    args.k = k;
    args.alpha = alpha;
    args.a = a;
    args.b = b;
    args.beta = beta;
    args.d = c;  // c stays null: beta reads D in place, as the CPU body reads C
    const cuda::MatmulContext context = cuda::stream_matmul_context(cuda, "matmul");
    cuda::matmul(args, context, cuda.handle());
    return;
  }
#endif
  dispatch_kernel(stream, "matmul",
                  [=] { cpu::matmul(trans_a, trans_b, m, n, k, alpha, a, b, beta, c); });
}

void matmul_ld(Stream& stream, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
               std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b,
               std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  check_leading_dimensions(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::CudaStream& cuda = cuda::cuda_stream(stream, "matmul");
    if (k == 0) {
      if (beta == 1.0f) return;
      // C is a block of a wider matrix: scale it row by row.
      for (std::int64_t row = 0; row < m; ++row) scale_empty_product(cuda, n, beta, c + row * ldc);
      return;
    }
    cuda::MatmulArgs args;
    args.trans_a = trans_a;
    args.trans_b = trans_b;
    args.m = m;
    args.n = n;
    args.k = k;
    args.alpha = alpha;
    args.a = a;
    args.b = b;
    args.beta = beta;
    args.d = c;
    args.lda = lda;
    args.ldb = ldb;
    args.ldd = ldc;
    const cuda::MatmulContext context = cuda::stream_matmul_context(cuda, "matmul");
    cuda::matmul(args, context, cuda.handle());
    return;
  }
#endif
  dispatch_kernel(stream, "matmul", [=] {
    cpu::matmul_ld(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  });
}

#if ZEST_HAVE_CUDA
namespace cuda {

MatmulContext stream_matmul_context(CudaStream& stream, const char* kernel) {
  return {stream.blas_handle(), stream.workspace(kMatmulWorkspaceBytes, kernel),
          kMatmulWorkspaceBytes, stream.fp32_matmul_rounding()};
}

}  // namespace cuda
#endif

}  // namespace zest
