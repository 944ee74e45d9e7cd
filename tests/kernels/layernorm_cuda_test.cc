// ctest-labels: gpu
// The CUDA LayerNorm against the CPU body on the same inputs. expect_close's floor is a magnitude
// (the bound is relative * max(|want|, floor)): an error set by the terms, not by a result that
// cancels to near zero, needs the terms' magnitude as its floor. Forward: both sum the row
// statistics in double and round the same operations to fp32, so they differ by an ulp or two of
// the mean, rstd and outputs: held to 1e-6 relative (floor 1, the magnitude of the normalized
// terms, for values near zero). Backward: fp32 row sums in different orders (a warp's tree
// against the CPU's loop) and nvcc's FMA contraction, at most cols * 2^-24 of the terms (96
// columns here: 6e-6): dx is held to 1e-5 relative (floor 1, its terms are about 1; dx itself can
// cancel to near zero, where a floor of 1e-5 would allow 1e-10). The column sums add rows in
// chunks instead of one by one: n * 2^-24 of the sum of n = 131 terms of about 1 each, so a floor
// of rows (1e-5 * rows absolute). Two runs of backward from the same state are bit-identical
// (deterministic column sums).
#include "kernels/layernorm_cuda.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "base/error.h"
#include "kernels/layernorm.h"
#include "runtime/cpu_device.h"
#include "runtime/cuda_device.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

using testing::DeviceArray;

constexpr std::int64_t kRows = 131;  // three chunks of column sums, the last one partial
constexpr std::int64_t kCols = 96;   // not a multiple of the warp's 32 lanes times 4

struct Inputs {
  std::vector<float> x = testing::random_floats(kRows * kCols, 1, 2.0f, 5.0f);  // far from 0
  std::vector<float> weight = testing::random_floats(kCols, 2, 0.5f, 1.0f);
  std::vector<float> bias = testing::random_floats(kCols, 3);
  std::vector<float> dy = testing::random_floats(kRows * kCols, 4);
  std::vector<float> dx = testing::random_floats(kRows * kCols, 5);  // accumulated into
  std::vector<float> dweight = testing::random_floats(kCols, 6);
  std::vector<float> dbias = testing::random_floats(kCols, 7);
};

TEST(LayerNormCuda, ForwardMatchesTheCpuBody) {
  ZEST_SKIP_WITHOUT_CUDA();
  const Inputs in;
  std::vector<float> y(in.x.size()), mean(kRows), rstd(kRows);
  cpu::layernorm_forward(in.x.data(), in.weight.data(), in.bias.data(), kRows, kCols, kLayerNormEps,
                         y.data(), mean.data(), rstd.data());
  DeviceArray<float> dx(in.x), dw(in.weight), db(in.bias), dy(y.size()), dmean(kRows), drstd(kRows);
  cuda::layernorm_forward(dx.data(), dw.data(), db.data(), kRows, kCols, kLayerNormEps, dy.data(),
                          dmean.data(), drstd.data(), nullptr);
  testing::expect_close(dy.download(), y, 1e-6, 1.0, "y");
  testing::expect_close(dmean.download(), mean, 1e-6, 1.0, "mean");
  testing::expect_close(drstd.download(), rstd, 1e-6, 1.0, "rstd");
}

TEST(LayerNormCuda, BackwardAccumulatesAsTheCpuBodyAndIsDeterministic) {
  ZEST_SKIP_WITHOUT_CUDA();
  const Inputs in;
  std::vector<float> y(in.x.size()), mean(kRows), rstd(kRows);
  cpu::layernorm_forward(in.x.data(), in.weight.data(), in.bias.data(), kRows, kCols, kLayerNormEps,
                         y.data(), mean.data(), rstd.data());
  std::vector<float> dx = in.dx, dweight = in.dweight, dbias = in.dbias;
  cpu::layernorm_backward(in.dy.data(), in.x.data(), in.weight.data(), mean.data(), rstd.data(),
                          kRows, kCols, dx.data(), dweight.data(), dbias.data());

  const std::size_t bytes = cuda::layernorm_backward_workspace_bytes(kRows, kCols);
  DeviceArray<unsigned char> workspace(bytes);
  DeviceArray<float> d_dy(in.dy), d_x(in.x), d_w(in.weight), d_mean(mean), d_rstd(rstd);
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    DeviceArray<float> d_dx(in.dx), d_dw(in.dweight), d_db(in.dbias);
    cuda::layernorm_backward(d_dy.data(), d_x.data(), d_w.data(), d_mean.data(), d_rstd.data(),
                             kRows, kCols, d_dx.data(), d_dw.data(), d_db.data(), workspace.data(),
                             bytes, nullptr);
    const auto got_dx = d_dx.download();
    const auto got_dw = d_dw.download();
    const auto got_db = d_db.download();
    testing::expect_close(got_dx, dx, 1e-5, 1.0, "dx");
    testing::expect_close(got_dw, dweight, 1e-5, kRows, "dweight");
    testing::expect_close(got_db, dbias, 1e-5, kRows, "dbias");
    std::vector<float> all = got_dx;
    all.insert(all.end(), got_dw.begin(), got_dw.end());
    all.insert(all.end(), got_db.begin(), got_db.end());
    runs.push_back(std::move(all));
  }
  testing::expect_bit_identical(runs[1], runs[0], "second run");
}

// The dispatch functions on a CudaStream (the stream's workspace for backward's column sums)
// against the same dispatch on the CPU device: they launch the bodies above, so the same
// tolerances hold. Backward starts from the CPU's mean and rstd, so only backward's error counts.
TEST(LayerNormCuda, DispatchOnACudaStreamMatchesTheCpuDispatch) {
  ZEST_SKIP_WITHOUT_CUDA();
  const Inputs in;
  cpu::CpuDevice host(0);
  auto host_stream = host.create_stream("compute");
  std::vector<float> y(in.x.size()), mean(kRows), rstd(kRows);
  std::vector<float> dx = in.dx, dweight = in.dweight, dbias = in.dbias;
  layernorm_forward(*host_stream, in.x.data(), in.weight.data(), in.bias.data(), kRows, kCols,
                    kLayerNormEps, y.data(), mean.data(), rstd.data());
  layernorm_backward(*host_stream, in.dy.data(), in.x.data(), in.weight.data(), mean.data(),
                     rstd.data(), kRows, kCols, dx.data(), dweight.data(), dbias.data());
  host_stream->synchronize();

  cuda::CudaDevice device(0);
  auto stream = device.create_stream("compute");
  DeviceArray<float> d_x(in.x), d_w(in.weight), d_b(in.bias), d_y(y.size()), d_mean(kRows),
      d_rstd(kRows), d_dy(in.dy), d_dx(in.dx), d_dw(in.dweight), d_db(in.dbias);
  layernorm_forward(*stream, d_x.data(), d_w.data(), d_b.data(), kRows, kCols, kLayerNormEps,
                    d_y.data(), d_mean.data(), d_rstd.data());
  stream->synchronize();
  testing::expect_close(d_y.download(), y, 1e-6, 1.0, "y");
  testing::expect_close(d_mean.download(), mean, 1e-6, 1.0, "mean");
  testing::expect_close(d_rstd.download(), rstd, 1e-6, 1.0, "rstd");
  d_mean.upload(mean);
  d_rstd.upload(rstd);
  layernorm_backward(*stream, d_dy.data(), d_x.data(), d_w.data(), d_mean.data(), d_rstd.data(),
                     kRows, kCols, d_dx.data(), d_dw.data(), d_db.data());
  stream->synchronize();
  testing::expect_close(d_dx.download(), dx, 1e-5, 1.0, "dx");
  testing::expect_close(d_dw.download(), dweight, 1e-5, kRows, "dweight");
  testing::expect_close(d_db.download(), dbias, 1e-5, kRows, "dbias");
}

TEST(LayerNormCudaArguments, ShapesAndWorkspaceAreCheckedOnTheHost) {
  EXPECT_THROW(cuda::layernorm_forward(nullptr, nullptr, nullptr, 4, 0, kLayerNormEps, nullptr,
                                       nullptr, nullptr, nullptr),
               Error);
  EXPECT_THROW(cuda::layernorm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, 4, 8, nullptr,
                                        nullptr, nullptr, nullptr, 0, nullptr),
               Error);
  EXPECT_NO_THROW(cuda::layernorm_forward(nullptr, nullptr, nullptr, 0, 8, kLayerNormEps, nullptr,
                                          nullptr, nullptr, nullptr));
}

}  // namespace
}  // namespace zest
