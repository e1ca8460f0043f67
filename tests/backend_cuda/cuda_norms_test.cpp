// The CUDA backend's norm_add (post-norm residual add), qk_norm (per-head RMSNorm of q and k) and
// softcap on random inputs against float64 references from the exact bf16 values the device
// holds; tolerances in cuda_test_util.h. Skips without a GPU.
#include "backend_cuda/cuda_test_util.h"

#include <cmath>

using namespace splitflow;
using namespace splitflow::test;

namespace {

class CudaNorms : public ::testing::Test {
 protected:
  void SetUp() override {
    SF_REQUIRE_GPU();
    backend = make_test_cuda_backend();
  }
  std::unique_ptr<Backend> backend;
  std::mt19937_64 rng{20261128};
};

// rmsnorm(x[0, n)) * (offset + w) in float64.
std::vector<double> rms_row(const float* x, int64_t n, const std::vector<float>& w, double offset, double eps) {
  double squares = 0;
  for (int64_t i = 0; i < n; ++i) squares += double{x[i]} * x[i];
  const double inv = 1.0 / std::sqrt(squares / n + eps);
  std::vector<double> y(n);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * (offset + w[i]);
  return y;
}

TEST_F(CudaNorms, NormAddAddsTheNormedRowToTheResidual) {
  for (const int64_t hidden : {640, 96, 1000}) {
    const int64_t tokens = 5;
    std::vector<float> x = random_values(rng, tokens * hidden, -3.0f, 3.0f);
    std::vector<float> residual = random_values(rng, tokens * hidden, -2.0f, 2.0f);
    const std::vector<float> weight = random_values(rng, hidden, -0.5f, 0.5f);
    DeviceBuffer d_x = to_device_bf16(*backend, x, {tokens, hidden});
    DeviceBuffer d_res = to_device_bf16(*backend, residual, {tokens, hidden});
    DeviceBuffer d_w = to_device_f32(*backend, weight, {hidden});
    backend->norm_add(d_x.view(), d_w.view(), {NormType::RMSNorm, 1e-6f, 1.0f}, d_res.view());
    std::vector<double> ref(tokens * hidden);
    for (int64_t t = 0; t < tokens; ++t) {
      const std::vector<double> normed = rms_row(x.data() + t * hidden, hidden, weight, 1.0, 1e-6);
      for (int64_t i = 0; i < hidden; ++i) ref[t * hidden + i] = residual[t * hidden + i] + normed[i];
    }
    EXPECT_LE(relative_error(to_host(*backend, d_res.view()), ref), kBf16Compute) << "hidden " << hidden;
  }
}

TEST_F(CudaNorms, QkNormNormalizesEveryQAndKHeadAndLeavesV) {
  struct Case {
    int heads, kv_heads, head_dim;
  };
  for (const Case c : {Case{4, 1, 256}, Case{8, 2, 128}, Case{4, 2, 16}, Case{2, 2, 40}}) {
    const int64_t tokens = 3, width = int64_t{c.heads + 2 * c.kv_heads} * c.head_dim;
    std::vector<float> qkv = random_values(rng, tokens * width, -4.0f, 4.0f);
    const std::vector<float> q_w = random_values(rng, c.head_dim, 0.5f, 1.5f), k_w = random_values(rng, c.head_dim, 0.5f, 1.5f);
    DeviceBuffer d_qkv = to_device_bf16(*backend, qkv, {tokens, width});
    DeviceBuffer d_q = to_device_f32(*backend, q_w, {c.head_dim}), d_k = to_device_f32(*backend, k_w, {c.head_dim});
    const AttentionParams params{c.heads, c.kv_heads, c.head_dim, 16, 1.0f, 0};
    backend->qk_norm(d_qkv.view(), d_q.view(), d_k.view(), {NormType::RMSNorm, 1e-6f, 0.0f}, params);
    std::vector<double> ref(qkv.begin(), qkv.end());
    for (int64_t t = 0; t < tokens; ++t)
      for (int h = 0; h < c.heads + c.kv_heads; ++h) {
        const int64_t at = t * width + int64_t{h} * c.head_dim;
        const std::vector<double> normed = rms_row(qkv.data() + at, c.head_dim, h < c.heads ? q_w : k_w, 0.0, 1e-6);
        std::copy(normed.begin(), normed.end(), ref.begin() + at);
      }
    const std::vector<float> got = to_host(*backend, d_qkv.view());
    EXPECT_LE(relative_error(got, ref), kOneRounding) << c.heads << "/" << c.kv_heads << " heads of " << c.head_dim;
    for (int64_t t = 0; t < tokens; ++t)  // v heads: untouched bits
      for (int64_t i = int64_t{c.heads + c.kv_heads} * c.head_dim; i < width; ++i)
        ASSERT_EQ(got[t * width + i], qkv[t * width + i]) << "v element " << i;
  }
}

TEST_F(CudaNorms, SoftcapIsCapTimesTanh) {
  std::vector<float> x = random_values(rng, 3 * 1001, -80.0f, 80.0f);
  DeviceBuffer d_x = to_device_f32(*backend, x, {3, 1001});
  backend->softcap(d_x.view(), 30.0f);
  std::vector<double> ref(x.size());
  for (size_t i = 0; i < x.size(); ++i) ref[i] = 30.0 * std::tanh(x[i] / 30.0);
  EXPECT_LE(relative_error(to_host(*backend, d_x.view()), ref), 1e-6);
}

}  // namespace
