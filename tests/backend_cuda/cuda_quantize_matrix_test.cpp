// --quantization in device memory (backend/cuda/quantize_matrix.*): quantize_matrix_on_cuda must
// write, byte for byte, what the host reference quant::quantize writes (itself tested against
// llama.cpp, gguf.quants and the fp64 definitions in tests/quant) for every quantized type, from
// f32, f16, bf16 and generated sources, across chunk boundaries, and fail as the host does on a
// block out of fp16's range. Skips without a GPU.
#include "backend_cuda/cuda_test_util.h"

#include "core/error.h"
#include "model/config.h"
#include "model/weights.h"
#include "quant/quant.h"
#include "test_paths.h"

#ifdef SPLITFLOW_HAS_CUDA
#include "backend/cuda/quantize_matrix.h"

#include <cuda_runtime.h>
#endif

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace splitflow;
using namespace splitflow::test;

namespace {

#ifdef SPLITFLOW_HAS_CUDA
Tensor on_device(const Tensor& matrix, DType type, int64_t chunk_elems = 0) {
  return quantize_matrix_on_cuda(matrix, type, chunk_elems);
}
#else
Tensor on_device(const Tensor&, DType, int64_t = 0) { return {}; }
#endif

// Rows that take the quantizers' edge paths: uniform values, all zeros, one constant, a lone
// outlier, values below llama.cpp's GROUP_MAX_EPS, negatives only, and a wide mix of magnitudes.
Tensor edge_matrix(int64_t cols, uint64_t seed) {
  const int64_t rows = 9;
  Tensor matrix = Tensor::zeros(DType::F32, {rows, cols});
  float* v = matrix.as<float>();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (int64_t j = 0; j < cols; ++j) {
    v[0 * cols + j] = uniform(rng);
    v[1 * cols + j] = 0.0f;
    v[2 * cols + j] = 0.375f;
    v[3 * cols + j] = j == cols / 3 ? 40.0f : normal(rng);
    v[4 * cols + j] = 1e-17f * uniform(rng);
    v[5 * cols + j] = -std::fabs(uniform(rng)) - 0.5f;
    v[6 * cols + j] = uniform(rng) * std::ldexp(1.0f, static_cast<int>(j % 24) - 12);
    v[7 * cols + j] = normal(rng);
    v[8 * cols + j] = j % 32 == 5 ? -3.0f : normal(rng);  // a block whose min is far below the rest
  }
  return matrix;
}

void expect_same_bytes(const Tensor& device, const Tensor& host, const std::string& what) {
  ASSERT_EQ(device.dtype, host.dtype) << what;
  ASSERT_EQ(device.shape, host.shape) << what;
  ASSERT_EQ(device.nbytes(), host.nbytes()) << what;
  const auto* a = static_cast<const uint8_t*>(device.data);
  const auto* b = static_cast<const uint8_t*>(host.data);
  const size_t row_bytes = dtype_row_bytes(host.dtype, host.shape.back());
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < host.nbytes(); ++i)
    if (a[i] != b[i] && differ++ == 0) first = i;
  if (differ == 0) return;
  // The 24 bytes from the first difference on both sides, to tell a field from a layout.
  std::string device_bytes, host_bytes;
  for (size_t i = first; i < std::min(first + 24, host.nbytes()); ++i) {
    device_bytes += fmt::format(" {:02x}", a[i]);
    host_bytes += fmt::format(" {:02x}", b[i]);
  }
  ADD_FAILURE() << what << ": " << differ << " of " << host.nbytes() << " bytes differ, the first at byte " << first
                << " (row " << first / row_bytes << ", byte " << first % row_bytes << " of the row)\n  device"
                << device_bytes << "\n  host  " << host_bytes;
}

// The same values stored as f16 or bf16 (rounded by core/dtype.h's encoders).
Tensor stored_as(const Tensor& f32, DType dtype) {
  Tensor out = Tensor::zeros(dtype, f32.shape);
  convert_from_f32(f32.as<float>(), dtype, out.data, static_cast<size_t>(f32.numel()));
  return out;
}

}  // namespace

TEST(CudaQuantizeMatrix, EveryTypeWritesTheHostQuantizersBytes) {
  SF_REQUIRE_GPU();
  const Tensor matrix = edge_matrix(512, 1);
  for (const quant::TypeInfo& info : quant::all_types())
    expect_same_bytes(on_device(matrix, info.type), quant::quantize(matrix, info.type),
                      std::string(dtype_name(info.type)));
}

TEST(CudaQuantizeMatrix, F16Bf16AndGeneratedSourcesAreReadAsTheHostReadsThem) {
  SF_REQUIRE_GPU();
  const Tensor f32 = edge_matrix(256, 2);
  const DType types[] = {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::Q3H_B64, DType::F8_CHANNEL, DType::I8_G32};
  for (DType source : {DType::F16, DType::BF16}) {
    const Tensor stored = stored_as(f32, source);
    for (DType type : types)
      expect_same_bytes(on_device(stored, type), quant::quantize(stored, type),
                        fmt::format("{} from {}", dtype_name(type), dtype_name(source)));
  }
  for (DType source : {DType::F32, DType::F16, DType::BF16}) {
    const Tensor generated = Tensor::generated_normal(source, {24, 768}, GeneratedNormal{0x5eed, 0.02f});
    for (DType type : types)
      expect_same_bytes(on_device(generated, type), quant::quantize(generated, type),
                        fmt::format("{} from generated {}", dtype_name(type), dtype_name(source)));
  }
}

TEST(CudaQuantizeMatrix, ChunksOfRowsGiveTheWholeMatrixsBytes) {
  SF_REQUIRE_GPU();
  const Tensor matrix = edge_matrix(256, 3);  // 9 rows: chunks of 2 rows leave one of 1
  for (DType type : {DType::Q4_0, DType::Q5_K, DType::Q4_B64, DType::F8_G128})
    expect_same_bytes(on_device(matrix, type, 2 * 256), quant::quantize(matrix, type),
                      fmt::format("{} in chunks of 2 rows", dtype_name(type)));
  const Tensor generated = Tensor::generated_normal(DType::BF16, {7, 512}, GeneratedNormal{42, 1.0f});
  expect_same_bytes(on_device(generated, DType::Q2_K, 3 * 512), quant::quantize(generated, DType::Q2_K),
                    "q2_k of a generated matrix in chunks of 3 rows");
}

TEST(CudaQuantizeMatrix, BadInputFailsAsOnTheHost) {
  SF_REQUIRE_GPU();
  // An Inferflow block beyond fp16's range: the host's message (row, values), not a silent inf.
  Tensor wide = edge_matrix(64, 4);
  wide.as<float>()[5 * 64 + 7] = 1e6f;
  std::string host_message;
  try {
    (void)quant::quantize(wide, DType::Q4_B32);
  } catch (const Error& e) {
    host_message = e.what();
  }
  ASSERT_NE(host_message.find("does not fit its fp16 min and scale"), std::string::npos) << host_message;
  try {
    (void)on_device(wide, DType::Q4_B32);
    ADD_FAILURE() << "no error for a block out of fp16's range";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), host_message);
  }
  // A row length the block does not divide: the host's check and message.
  const Tensor odd = edge_matrix(96, 5);
  EXPECT_THROW((void)on_device(odd, DType::Q4_K), Error);
}

// One quantizer for a model's many matrices: its buffers grow (a wider source, a stored matrix
// after generated ones) and are reused (a smaller one after a larger), bytes unchanged.
TEST(CudaQuantizeMatrix, OneQuantizerManyMatricesKeepsTheHostBytes) {
  SF_REQUIRE_GPU();
#ifdef SPLITFLOW_HAS_CUDA
  const CudaMatrixQuantizer quantizer(4 * 1024);
  const CudaMatrixQuantizer copy = quantizer;  // shares the buffers, as a std::function's copies do
  const Tensor small = edge_matrix(256, 6), wide = edge_matrix(2048, 7);
  const Tensor generated = Tensor::generated_normal(DType::BF16, {5, 1024}, GeneratedNormal{11, 0.02f});
  const Tensor stored_bf16 = stored_as(wide, DType::BF16);
  int step = 0;
  for (const auto& [matrix, type] : std::vector<std::pair<const Tensor*, DType>>{
           {&small, DType::Q4_0}, {&generated, DType::Q4_K}, {&wide, DType::Q6_K}, {&stored_bf16, DType::Q8_0},
           {&small, DType::F8_CHANNEL}, {&wide, DType::Q3H_B64}}) {
    const CudaMatrixQuantizer& use = step++ % 2 == 0 ? quantizer : copy;
    expect_same_bytes(use(*matrix, type), quant::quantize(*matrix, type),
                      fmt::format("step {} {} {}", step, dtype_name(type), shape_str(matrix->shape)));
  }
#endif
}

TEST(CudaQuantizeMatrix, DummyWeightsQuantizedOnTheDeviceMatchTheHost) {
  SF_REQUIRE_GPU();
  ModelSpec spec = resolve_config_spec(fixture_path("model/configs/llama-3.1-8b-instruct/config.json"));
  spec.num_layers = 1;
  spec.vocab_size = 1000;
  spec.bos_token_id = -1;
  spec.eos_token_ids.clear();
  for (DType type : {DType::Q4_K, DType::Q8_0}) {
    const ModelWeights host = make_dummy_weights(spec, DType::BF16, 3, type);
#ifdef SPLITFLOW_HAS_CUDA
    const ModelWeights device = make_dummy_weights(spec, DType::BF16, 3, type, [](const Tensor& m, DType t) {
      return quantize_matrix_on_cuda(m, t);
    });
#else
    const ModelWeights device = host;
#endif
    const std::string name(dtype_name(type));
    expect_same_bytes(device.layers[0].wqkv, host.layers[0].wqkv, name + " wqkv");
    expect_same_bytes(device.layers[0].wo, host.layers[0].wo, name + " wo");
    expect_same_bytes(device.layers[0].w_gate_up, host.layers[0].w_gate_up, name + " w_gate_up");
    expect_same_bytes(device.layers[0].w_down, host.layers[0].w_down, name + " w_down");
    expect_same_bytes(device.lm_head, host.lm_head, name + " lm_head");
  }
}

// The two kernels alone, on device buffers this test fills and reads: the f32 widening returns the
// stored values exactly, and the quantizer, given those values, the host's bytes (a failure here
// and not above would be in quantize_matrix.cpp's driving; above and not here, in the kernels).
TEST(CudaQuantizeMatrix, KernelsAloneWidenExactlyAndQuantizeAsTheHost) {
  SF_REQUIRE_GPU();
#ifdef SPLITFLOW_HAS_CUDA
  const Tensor matrix = edge_matrix(256, 6);
  const size_t count = static_cast<size_t>(matrix.numel());
  const Tensor bf16 = stored_as(matrix, DType::BF16);
  void* stored = nullptr;
  float* values = nullptr;
  uint8_t* packed = nullptr;
  unsigned long long* bad = nullptr;
  ASSERT_EQ(cudaMalloc(&stored, bf16.nbytes()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&values, count * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&packed, 1 << 20), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&bad, sizeof *bad), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(stored, bf16.data, bf16.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cuda::launch_matrix_to_f32(stored, DType::BF16, 0, 0.0f, 0, values, static_cast<int64_t>(count), nullptr),
            cudaSuccess);
  std::vector<float> widened(count);
  ASSERT_EQ(cudaMemcpy(widened.data(), values, count * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  const Tensor expected = to_dtype(bf16, DType::F32);
  EXPECT_EQ(std::memcmp(widened.data(), expected.data, count * sizeof(float)), 0) << "bf16 widened to f32";
  const int64_t rows = matrix.dim(0), cols = matrix.dim(1);
  for (DType type : {DType::Q4_0, DType::Q8_0, DType::Q6_K, DType::Q3_K, DType::Q4_B32}) {
    const size_t bytes = dtype_row_bytes(type, cols) * static_cast<size_t>(rows);
    ASSERT_EQ(cudaMemset(packed, 0, bytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(bad, 0xff, sizeof *bad), cudaSuccess);
    ASSERT_EQ(cuda::launch_quantize_rows(type, values, rows, cols, packed, bad, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Tensor device = Tensor::zeros(type, matrix.shape);
    ASSERT_EQ(cudaMemcpy(device.data, packed, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    expect_same_bytes(device, quant::quantize(expected, type), fmt::format("{} by the kernel alone", dtype_name(type)));
  }
  cudaFree(stored);
  cudaFree(values);
  cudaFree(packed);
  cudaFree(bad);
#endif
}
