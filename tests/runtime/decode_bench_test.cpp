// Decode and prefill speed of a TinyLlama-1.1B-shaped model with dummy weights (hidden 2048,
// 22 layers, 32 heads, 4 KV heads, FFN 5632, vocab 32000), in tokens/s and the weight bandwidth
// those imply (every matrix is streamed once per decode step; the embedding row is gathered).
// Runs only with SPLITFLOW_BENCH=1; SPLITFLOW_BENCH_DTYPES picks dtypes (default "f16,bf16").
#include "runtime/model_runner.h"

#include "backend/backend.h"
#include "backend/cpu/stream_read.h"
#include "runtime/runner_test_util.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <cstdlib>
#include <sstream>
#include <vector>

using namespace splitflow;

namespace {

ModelSpec tinyllama_spec() {
  ModelSpec spec = test::tiny_spec();
  spec.name = "tinyllama-1.1b-shape";
  spec.hidden_size = 2048;
  spec.num_layers = 22;
  spec.vocab_size = 32000;
  spec.max_position = 2048;
  spec.attention.num_heads = 32;
  spec.attention.num_kv_heads = 4;
  spec.attention.head_dim = 64;
  spec.mlp.intermediate_size = 5632;
  return test::named(spec);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The roofline of this run: GB/s of a streaming read (cpu::stream_read) over the same matrices on
// the same threads, the best of three passes.
double streaming_read_gbs(const std::vector<const Tensor*>& matrices, int threads) {
  double bytes = 0.0, best = 1e30;
  for (const Tensor* m : matrices) bytes += static_cast<double>(m->nbytes());
  for (int pass = 0; pass < 3; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    uint64_t checksum = 0;
    for (const Tensor* m : matrices) checksum ^= cpu::stream_read(m->data, m->nbytes(), threads);
    best = std::min(best, seconds_since(start));
    volatile uint64_t sink = checksum;
    (void)sink;
  }
  return bytes / best / 1e9;
}

TEST(DecodeBench, TinyLlamaShape) {
  const char* flag = std::getenv("SPLITFLOW_BENCH");
  if (flag == nullptr || std::string(flag) != "1") GTEST_SKIP() << "set SPLITFLOW_BENCH=1";
  const char* dtype_list = std::getenv("SPLITFLOW_BENCH_DTYPES");
  std::stringstream dtypes(dtype_list != nullptr ? dtype_list : "f16,bf16");
  const ModelSpec spec = tinyllama_spec();
  const int threads = omp_get_max_threads();
  auto backend = make_cpu_backend(threads);
  for (std::string name; std::getline(dtypes, name, ',');) {
    const DType dtype = parse_dtype(name);
    ModelWeights weights = make_dummy_weights(spec, dtype, 1);
    const ModelWeights host_view = weights;  // shares the storage, for the streaming-read roofline
    std::vector<const Tensor*> matrices = {&host_view.lm_head};
    for (const LayerWeights& layer : host_view.layers)
      for (const Tensor* m : {&layer.wqkv, &layer.wo, &layer.w_gate_up, &layer.w_down}) matrices.push_back(m);
    double matrix_bytes = 0.0;
    for (const Tensor* m : matrices) matrix_bytes += static_cast<double>(m->nbytes());
    const int prompt_len = 64, decode_steps = 32;
    const KvCacheConfig kv{(prompt_len + decode_steps) / 16 + 1, 16};
    ModelRunner runner(spec, std::move(weights), *backend, kv, {prompt_len, 1});
    std::vector<int32_t> table(kv.num_blocks);
    for (int b = 0; b < kv.num_blocks; ++b) table[b] = b;
    std::mt19937_64 rng(3);
    const std::vector<int32_t> prompt = test::random_tokens(rng, prompt_len, spec.vocab_size);

    auto start = std::chrono::steady_clock::now();
    runner.forward(test::single_span(prompt, 0, prompt_len, table, LogitsMode::Last));
    const double prefill_s = seconds_since(start);

    ForwardBatch step;
    step.spans = {{1, prompt_len, table, true}};
    step.token_ids = {prompt[0]};
    runner.forward(step);  // warm-up step
    start = std::chrono::steady_clock::now();
    const std::clock_t cpu_start = std::clock();
    for (int i = 1; i <= decode_steps; ++i) {
      step.spans[0].start_position = prompt_len + i;
      runner.forward(step);
    }
    const double decode_s = seconds_since(start) / decode_steps;
    // CPU seconds per wall second: below the thread count when other processes share the cores.
    const double cpu_share = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC / (decode_s * decode_steps);
    const double roofline_gbs = streaming_read_gbs(matrices, threads);
    std::printf("%s %s: prefill %d tokens %.2f s (%.1f tok/s); decode %.1f ms/token = %.2f tok/s, %.1f GB/s of "
                "weights = %.0f%% of a streaming read (%.1f GB/s) in this run (%.2f CPUs busy)\n",
                spec.name.c_str(), name.c_str(), prompt_len, prefill_s, prompt_len / prefill_s, decode_s * 1e3,
                1.0 / decode_s, matrix_bytes / decode_s / 1e9, 100.0 * matrix_bytes / decode_s / 1e9 / roofline_gbs,
                roofline_gbs, cpu_share);
  }
}

}  // namespace
