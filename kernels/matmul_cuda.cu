#include "kernels/matmul_cuda.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "base/cublas_check.h"
#include "base/cublaslt_library.h"
#include "base/error.h"

namespace zest::cuda {
namespace {

// cuBLASLt's descriptors, destroyed however the call ends (base/cublaslt_library.h).
struct DestroyDesc {
  void operator()(cublasLtMatmulDesc_t desc) const { (void)cublaslt().desc_destroy(desc); }
};
struct DestroyLayout {
  void operator()(cublasLtMatrixLayout_t layout) const { (void)cublaslt().layout_destroy(layout); }
};
struct DestroyPreference {
  void operator()(cublasLtMatmulPreference_t pref) const {
    (void)cublaslt().preference_destroy(pref);
  }
};
using OpDesc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, DestroyDesc>;
using Layout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, DestroyLayout>;
using Preference =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, DestroyPreference>;

[[noreturn]] void usage(const std::string& what) {
  throw Error(ErrorKind::kUsage, "matmul (CUDA): " + what);
}

void check_dimension(const char* name, std::int64_t value, std::int64_t least) {
  if (value < least || value > INT_MAX) {
    usage(std::string(name) + " must be in [" + std::to_string(least) + ", 2^31), got " +
          std::to_string(value));
  }
}

cudaDataType_t cuda_type(DType type) {
  switch (type) {
    case DType::kFloat32: return CUDA_R_32F;
    case DType::kBFloat16: return CUDA_R_16BF;
    case DType::kFloat16: return CUDA_R_16F;
    default: usage(std::string("unsupported dtype ") + dtype_name(type));
  }
}

void check_args(const MatmulArgs& x) {
  check_dimension("m", x.m, 0);
  check_dimension("n", x.n, 0);
  check_dimension("k", x.k, 1);
  (void)cuda_type(x.input_type);
  (void)cuda_type(x.output_type);
  // cuBLASLt with fp32 compute: fp32 -> fp32, 16-bit -> fp32 or the same 16-bit type.
  if (x.input_type == DType::kFloat32 ? x.output_type != DType::kFloat32
                                      : x.output_type != DType::kFloat32 &&
                                            x.output_type != x.input_type) {
    usage(std::string("no ") + dtype_name(x.input_type) + " -> " + dtype_name(x.output_type) +
          " product");
  }
  check_dimension("batch", x.batch, 1);
  if (x.stride_a < 0 || x.stride_b < 0 || x.stride_d < 0) usage("batch strides must be >= 0");
  if (x.lda < 0 || x.ldb < 0 || x.ldd < 0 || x.lda > INT_MAX || x.ldb > INT_MAX ||
      x.ldd > INT_MAX) {
    usage("leading dimensions must be in [0, 2^31)");
  }
  if ((x.lda > 0 && x.lda < (x.trans_a ? x.m : x.k)) ||
      (x.ldb > 0 && x.ldb < (x.trans_b ? x.k : x.n)) || (x.ldd > 0 && x.ldd < x.n)) {
    usage("a leading dimension is below its stored row length");
  }
  if ((x.lda > 0 || x.ldb > 0 || x.ldd > 0) && x.epilogue == MatmulEpilogue::kGeluBias) {
    usage("no kGeluBias with leading dimensions");  // its aux matrix is written contiguous
  }
  if (x.epilogue != MatmulEpilogue::kNone && x.batch > 1) usage("no epilogue with batch > 1");
  if (x.epilogue != MatmulEpilogue::kNone && x.bias == nullptr) usage("the epilogue needs a bias");
  if (x.epilogue == MatmulEpilogue::kGeluBias) {
    if (x.gelu_input == nullptr) usage("kGeluBias needs gelu_input");
    if (x.n % 8 != 0) usage("kGeluBias needs n % 8 == 0, got n = " + std::to_string(x.n));
  }
}

// The largest power of two (up to 256, cuBLASLt's default assumption) dividing the address and,
// in a batch, the stride between operands (operand i sits at pointer + i * stride_bytes).
std::uint32_t alignment_of(const void* pointer, std::int64_t batch, std::int64_t stride,
                           DType type) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  const auto stride_bytes =
      batch > 1 ? static_cast<std::uintptr_t>(stride) * dtype_size(type) : std::uintptr_t{0};
  std::uint32_t bytes = 256;
  while (bytes > 1 && (address % bytes != 0 || stride_bytes % bytes != 0)) bytes /= 2;
  return bytes;
}

// A block of a wider matrix starts each row `ld` elements after the last: every row start must
// have the alignment claimed, not only the first. ld 0 (contiguous) keeps today's claim.
std::uint32_t with_leading(std::uint32_t bytes, std::int64_t ld, DType type) {
  const auto row_bytes = static_cast<std::uint64_t>(ld) * dtype_size(type);
  while (bytes > 1 && ld > 0 && row_bytes % bytes != 0) bytes /= 2;
  return bytes;
}

Layout layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols, std::int64_t ld,
              std::int64_t batch, std::int64_t stride) {
  cublasLtMatrixLayout_t raw = nullptr;
  ZEST_CUBLAS_CHECK(cublaslt().layout_create(&raw, type, static_cast<std::uint64_t>(rows),
                                             static_cast<std::uint64_t>(cols), ld));
  Layout owned(raw);
  if (batch > 1) {
    const auto count = static_cast<std::int32_t>(batch);
    ZEST_CUBLAS_CHECK(
        cublaslt().layout_set(raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    ZEST_CUBLAS_CHECK(cublaslt().layout_set(raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                            &stride, sizeof(stride)));
  }
  return owned;
}

template <typename T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  ZEST_CUBLAS_CHECK(cublaslt().desc_set(desc, attribute, &value, sizeof(value)));
}

template <typename T>
void set(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attribute,
         const T& value) {
  ZEST_CUBLAS_CHECK(cublaslt().preference_set(pref, attribute, &value, sizeof(value)));
}

cublasComputeType_t compute_type(const MatmulArgs& x, const MatmulContext& context) {
  if (x.input_type != DType::kFloat32) return CUBLAS_COMPUTE_32F;
  switch (context.fp32_rounding) {
    case DType::kBFloat16: return CUBLAS_COMPUTE_32F_FAST_16BF;
    case DType::kFloat16: return CUBLAS_COMPUTE_32F_FAST_16F;
    default: return CUBLAS_COMPUTE_32F;
  }
}

// The operation: compute type, transposes and epilogue. The layouts say the shapes.
OpDesc make_desc(const MatmulArgs& x, cublasComputeType_t compute) {
  cublasLtMatmulDesc_t raw_desc = nullptr;
  // Note: CUBLAS_COMPUTE_32F is true fp32 (never TF32, whose 10-bit mantissa is neither exact
  // nor bf16 training's rounding); for 16-bit inputs it is fp32 accumulation. 2-byte training
  // asks for fp32 inputs rounded to its type instead: the tensor cores' rate, as autocast.
  ZEST_CUBLAS_CHECK(cublaslt().desc_create(&raw_desc, compute, CUDA_R_32F));
  OpDesc desc(raw_desc);
  set(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, x.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  set(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, x.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  if (x.epilogue != MatmulEpilogue::kNone) {
    const cublasLtEpilogue_t epilogue = x.epilogue == MatmulEpilogue::kBias
                                            ? CUBLASLT_EPILOGUE_BIAS
                                            : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    set(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
    set(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, x.bias);
    if (x.epilogue == MatmulEpilogue::kGeluBias) {
      set(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, x.gelu_input);
      set(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, x.n);
    }
  }
  return desc;
}

// The heuristic's best algorithm, or false where cuBLASLt has none for these operands (it says
// so with a count of 0 or with CUBLAS_STATUS_NOT_SUPPORTED, depending on the version).
bool find_algorithm(const MatmulContext& context, const OpDesc& desc, const Layout& b_layout,
                    const Layout& a_layout, const Layout& d_layout, const Preference& pref,
                    cublasLtMatmulHeuristicResult_t& heuristic) {
  int found = 0;
  const cublasStatus_t status =
      cublaslt().heuristic(context.handle, desc.get(), b_layout.get(), a_layout.get(),
                           d_layout.get(), d_layout.get(), pref.get(), 1, &heuristic, &found);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  ZEST_CUBLAS_CHECK(status);
  return found > 0;
}

}  // namespace

void matmul(const MatmulArgs& x, const MatmulContext& context, cudaStream_t stream) {
  if (!try_matmul(x, context, stream)) {
    throw Error(ErrorKind::kDevice,
                "matmul (CUDA): cuBLASLt has no algorithm for m = " + std::to_string(x.m) +
                    ", n = " + std::to_string(x.n) + ", k = " + std::to_string(x.k) +
                    ", batch = " + std::to_string(x.batch) + " (" +
                    dtype_name(x.input_type) + " -> " + dtype_name(x.output_type) + ") within " +
                    std::to_string(context.workspace_bytes) + " workspace bytes");
  }
}

bool try_matmul(const MatmulArgs& x, const MatmulContext& context, cudaStream_t stream) {
  check_args(x);
  if (x.m == 0 || x.n == 0) return true;
  const cudaDataType_t in_type = cuda_type(x.input_type);
  const cudaDataType_t out_type = cuda_type(x.output_type);
  const void* c = x.c != nullptr ? x.c : x.d;

  // Note: cuBLASLt is column-major. A row-major [r, s] matrix is a column-major [s, r] one, so
  // the row-major D = op(A) op(B) is the column-major Dᵀ = op(B)ᵀ op(A)ᵀ: B goes first, the
  // transposes keep their meaning, and the bias (one value per column-major row of Dᵀ, i.e. per
  // row-major column of D) is broadcast over the rows of D as add_bias does.
  // Stored shapes: B is [k, n] (or [n, k] transposed), A is [m, k] (or [k, m]).
  // A row-major leading dimension is the column-major one of the transposed view: the same
  // number, the distance between the stored rows.
  const std::int64_t ldb = x.ldb > 0 ? x.ldb : (x.trans_b ? x.k : x.n);
  const std::int64_t lda = x.lda > 0 ? x.lda : (x.trans_a ? x.m : x.k);
  const std::int64_t ldd = x.ldd > 0 ? x.ldd : x.n;
  const Layout b_layout = x.trans_b ? layout(in_type, x.k, x.n, ldb, x.batch, x.stride_b)
                                    : layout(in_type, x.n, x.k, ldb, x.batch, x.stride_b);
  const Layout a_layout = x.trans_a ? layout(in_type, x.m, x.k, lda, x.batch, x.stride_a)
                                    : layout(in_type, x.k, x.m, lda, x.batch, x.stride_a);
  const Layout d_layout = layout(out_type, x.n, x.m, ldd, x.batch, x.stride_d);

  cublasLtMatmulPreference_t raw_pref = nullptr;
  ZEST_CUBLAS_CHECK(cublaslt().preference_create(&raw_pref));
  const Preference pref(raw_pref);
  set(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, context.workspace_bytes);
  // Note: parameters are views into flat buffers and activations offsets into one saved buffer,
  // so operands need not be 256-byte aligned (cuBLASLt's default assumption, under which it may
  // pick an algorithm that faults on them): say what they really are.
  set(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
      with_leading(alignment_of(x.b, x.batch, x.stride_b, x.input_type), x.ldb, x.input_type));
  set(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      with_leading(alignment_of(x.a, x.batch, x.stride_a, x.input_type), x.lda, x.input_type));
  set(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
      with_leading(alignment_of(c, x.batch, x.stride_d, x.output_type), x.ldd, x.output_type));
  set(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
      with_leading(alignment_of(x.d, x.batch, x.stride_d, x.output_type), x.ldd, x.output_type));

  const cublasComputeType_t wanted = compute_type(x, context);
  OpDesc desc = make_desc(x, wanted);
  cublasLtMatmulHeuristicResult_t heuristic{};
  bool found = find_algorithm(context, desc, b_layout, a_layout, d_layout, pref, heuristic);
  if (!found && wanted != CUBLAS_COMPUTE_32F) {
    // Note: the fast modes *allow* bf16 / fp16 tensor cores; where cuBLASLt has no such kernel
    // for these operands (fp32 views only 4-byte aligned, say), exact fp32 is the same product
    // without the inputs' rounding: slower, never a failed step.
    desc = make_desc(x, CUBLAS_COMPUTE_32F);
    found = find_algorithm(context, desc, b_layout, a_layout, d_layout, pref, heuristic);
  }
  if (!found) return false;
  ZEST_CUBLAS_CHECK(cublaslt().matmul(context.handle, desc.get(), &x.alpha, x.b, b_layout.get(),
                                      x.a, a_layout.get(), &x.beta, c, d_layout.get(), x.d,
                                      d_layout.get(), &heuristic.algo, context.workspace,
                                      context.workspace_bytes, stream));
  return true;
}

}  // namespace zest::cuda
