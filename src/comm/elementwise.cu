#include "comm/elementwise.h"

#include "comm/cuda_check.h"
#include "comm/custom_allreduce_kernels.cuh"

#include <algorithm>

namespace splitflow::comm {

namespace {

using detail::aligned16;
using detail::Elem;

template <typename T>
__global__ void add_kernel(const T* a, const T* b, T* out, int64_t count) {
  constexpr int E = Elem<T>::kPack;
  const bool vector_io = aligned16(a) && aligned16(b) && aligned16(out);
  const int64_t packs = vector_io ? count / E : 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = tid; i < packs; i += stride) {
    float x[E], y[E];
    Elem<T>::unpack(reinterpret_cast<const int4*>(a)[i], x);
    Elem<T>::unpack(reinterpret_cast<const int4*>(b)[i], y);
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] += y[e];
    reinterpret_cast<int4*>(out)[i] = Elem<T>::pack(x);
  }
  for (int64_t i = packs * E + tid; i < count; i += stride) Elem<T>::store(out + i, Elem<T>::load(a + i) + Elem<T>::load(b + i));
}

template <typename T>
__global__ void rms_norm_kernel(const T* in, const float* weight, T* out, int hidden, float eps) {
  constexpr int E = Elem<T>::kPack;
  const T* row_in = in + static_cast<int64_t>(blockIdx.x) * hidden;
  T* row_out = out + static_cast<int64_t>(blockIdx.x) * hidden;
  const bool vector_io = hidden % E == 0 && aligned16(row_in) && aligned16(row_out) && aligned16(weight);
  float squares = 0.0f;
  if (vector_io) {
    for (int j = threadIdx.x; j < hidden / E; j += blockDim.x) {
      float v[E];
      Elem<T>::unpack(reinterpret_cast<const int4*>(row_in)[j], v);
#pragma unroll
      for (int e = 0; e < E; ++e) squares += v[e] * v[e];
    }
  } else {
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
      const float v = Elem<T>::load(row_in + i);
      squares += v * v;
    }
  }
  const float scale = rsqrtf(detail::block_sum(squares) / hidden + eps);
  if (vector_io) {
    for (int j = threadIdx.x; j < hidden / E; j += blockDim.x) {
      float v[E];
      Elem<T>::unpack(reinterpret_cast<const int4*>(row_in)[j], v);
#pragma unroll
      for (int e = 0; e < E; ++e) v[e] = v[e] * scale * weight[j * E + e];
      reinterpret_cast<int4*>(row_out)[j] = Elem<T>::pack(v);
    }
  } else {
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
      Elem<T>::store(row_out + i, Elem<T>::load(row_in + i) * scale * weight[i]);
    }
  }
}

template <typename T>
void launch_add(const void* a, const void* b, void* out, size_t count, cudaStream_t stream) {
  const size_t threads = 256;
  const size_t blocks = std::clamp<size_t>((count / Elem<T>::kPack + threads - 1) / threads, 1, 1024);
  add_kernel<T><<<blocks, threads, 0, stream>>>(static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out),
                                                static_cast<int64_t>(count));
}

template <typename T>
void launch_rms_norm(const void* in, const float* weight, void* out, size_t rows, size_t hidden, float eps,
                     cudaStream_t stream) {
  const int threads = static_cast<int>(std::clamp<size_t>((hidden / Elem<T>::kPack + 31) / 32 * 32, 32, 1024));
  rms_norm_kernel<T><<<rows, threads, 0, stream>>>(static_cast<const T*>(in), weight, static_cast<T*>(out),
                                                   static_cast<int>(hidden), eps);
}

}  // namespace

void add(const void* a, const void* b, void* out, size_t count, DType dtype, cudaStream_t stream) {
  if (count == 0) return;
  switch (dtype) {
    case DType::F32: launch_add<float>(a, b, out, count, stream); break;
    case DType::F16: launch_add<__half>(a, b, out, count, stream); break;
    case DType::BF16: launch_add<__nv_bfloat16>(a, b, out, count, stream); break;
    default: fail("comm add: dtype {} (f32, f16 or bf16)", dtype_name(dtype));
  }
  SF_CUDA_CHECK(cudaGetLastError());
}

void rms_norm(const void* in, const float* weight, void* out, size_t rows, size_t hidden, float eps, DType dtype,
              cudaStream_t stream) {
  if (rows == 0) return;
  SF_CHECK(hidden > 0, "comm rms_norm: hidden must be positive");
  switch (dtype) {
    case DType::F32: launch_rms_norm<float>(in, weight, out, rows, hidden, eps, stream); break;
    case DType::F16: launch_rms_norm<__half>(in, weight, out, rows, hidden, eps, stream); break;
    case DType::BF16: launch_rms_norm<__nv_bfloat16>(in, weight, out, rows, hidden, eps, stream); break;
    default: fail("comm rms_norm: dtype {} (f32, f16 or bf16)", dtype_name(dtype));
  }
  SF_CUDA_CHECK(cudaGetLastError());
}

}  // namespace splitflow::comm
