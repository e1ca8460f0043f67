// ModelRunner::warm_up on the CPU. The CPU backend cannot record, so warm-up runs one eager decode step there;
// the recording path runs on RecordingCpuBackend, the CPU kernels behind recording the way a CUDA
// graph does (kernel calls kept with their buffer views, run again at replay on what the buffers
// then hold). Warm-up must record every decode bucket, and leave the KV cache and every later
// output bit-identical to a runner that never warmed up.
#include "backend/forwarding_backend.h"
#include "runtime/runner_test_util.h"

#include "backend/backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>

namespace splitflow::test {
namespace {

class RecordingCpuBackend final : public ForwardingBackend {
 public:
  int32_t num_recordings() const { return num_recordings_; }

  std::string name() const override { return "cpu (recording)"; }

  bool can_record() const override { return true; }
  std::unique_ptr<RecordedWork> record(const std::function<void()>& issue) override {
    auto recording = std::make_unique<Recording>();
    kernels_ = &recording->kernels;
    try {
      issue();
    } catch (...) {
      kernels_ = nullptr;
      throw;
    }
    kernels_ = nullptr;
    ++num_recordings_;
    return recording;
  }

  void embed(const DeviceTensor& table, const DeviceTensor& token_ids, float multiplier, const DeviceTensor& pos_table,
             const DeviceTensor& positions, const DeviceTensor& out) override {
    run([=, cpu = &inner()] { cpu->embed(table, token_ids, multiplier, pos_table, positions, out); });
  }
  void add_norm(const DeviceTensor& residual, const DeviceTensor& delta, const DeviceTensor& weight,
                const DeviceTensor& bias, const NormParams& params, const DeviceTensor& out) override {
    run([=, cpu = &inner()] { cpu->add_norm(residual, delta, weight, bias, params, out); });
  }
  void matmul(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& bias, const DeviceTensor& y,
              bool accumulate) override {
    run([=, cpu = &inner()] { cpu->matmul(x, w, bias, y, accumulate); });
  }
  void rope(const DeviceTensor& qkv, const DeviceTensor& cos_sin, const DeviceTensor& table_rows,
            const RopeParams& params) override {
    run([=, cpu = &inner()] { cpu->rope(qkv, cos_sin, table_rows, params); });
  }
  void write_kv(const DeviceTensor& qkv, const DeviceTensor& slots, const AttentionParams& params,
                const DeviceTensor& k_cache, const DeviceTensor& v_cache) override {
    run([=, cpu = &inner()] { cpu->write_kv(qkv, slots, params, k_cache, v_cache); });
  }
  void rope_write_kv(const DeviceTensor& qkv, const DeviceTensor& cos_sin, const DeviceTensor& table_rows,
                     const RopeParams& rope_params, const DeviceTensor& slots, const AttentionParams& attention_params,
                     const DeviceTensor& k_cache, const DeviceTensor& v_cache) override {
    run([=, cpu = &inner()] {
      cpu->rope_write_kv(qkv, cos_sin, table_rows, rope_params, slots, attention_params, k_cache, v_cache);
    });
  }
  void attention(const DeviceTensor& qkv, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                 const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out) override {
    run([=, cpu = &inner()] { cpu->attention(qkv, k_cache, v_cache, batch, params, out); });
  }
  void activation(const DeviceTensor& x, Activation act, bool gated, const DeviceTensor& out) override {
    run([=, cpu = &inner()] { cpu->activation(x, act, gated, out); });
  }
  void matmul_activation(const InputNorm& norm, const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& bias,
                         Activation act, bool gated, const DeviceTensor& product, const DeviceTensor& out) override {
    run([=, cpu = &inner()] { cpu->matmul_activation(norm, x, w, bias, act, gated, product, out); });
  }
  void gather_rows(const DeviceTensor& x, const DeviceTensor& rows, const DeviceTensor& out) override {
    run([=, cpu = &inner()] { cpu->gather_rows(x, rows, out); });
  }
  void sample(const DeviceTensor& logits, const DeviceTensor& rows, const DeviceTensor& tokens) override {
    run([=, cpu = &inner()] { cpu->sample(logits, rows, tokens); });
  }

 private:
  struct Recording final : RecordedWork {
    std::vector<std::function<void()>> kernels;
    void replay() override {
      for (const auto& kernel : kernels) kernel();
    }
  };
  void run(std::function<void()> kernel) {
    if (kernels_ != nullptr) {
      kernels_->push_back(std::move(kernel));
    } else {
      kernel();
    }
  }

  std::vector<std::function<void()>>* kernels_ = nullptr;  // the recording in progress
  int32_t num_recordings_ = 0;
};

bool same_logits(const Tensor& a, const Tensor& b) {
  return a.shape == b.shape && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

// The CPU records nothing; one eager decode step makes what it prepares at a matrix's first
// product (its repacked copies of quantized matrices), and changes no later output.
TEST(WarmUp, CpuBackendRunsOneEagerDecodeStep) {
  auto backend = make_cpu_backend(1), cold_backend = make_cpu_backend(1);
  const ModelSpec spec = tiny_spec();
  const ModelWeights weights = random_weights(spec, DType::F32, 31);
  ModelRunner runner(spec, weights, *backend, {16, 4}, {32, 8});
  ModelRunner cold(spec, weights, *cold_backend, {16, 4}, {32, 8});
  const WarmupReport report = runner.warm_up();
  EXPECT_EQ(report.decode_buckets, (std::vector<int32_t>{1}));
  EXPECT_EQ(report.decode_recordings, 0);
  EXPECT_EQ(report.prefill_tokens, 0);
  std::mt19937_64 rng(35);
  const std::vector<int32_t> tokens = random_tokens(rng, 12, spec.vocab_size);
  const ForwardBatch prompt = single_span(tokens, 0, 12, iota_blocks(4, 0), LogitsMode::All);
  EXPECT_TRUE(same_logits(runner.forward(prompt), cold.forward(prompt)));
}

TEST(WarmUp, RecordsEveryDecodeBucketOnce) {
  const ModelSpec spec = tiny_spec();  // max_position 64
  const ModelWeights weights = random_weights(spec, DType::F32, 32);
  struct Case {
    RunnerLimits limits;
    bool device_sampling;
    std::vector<int32_t> buckets;  // 1, 2, 4, 8, multiples of 8 to 64, of 32 past it, capped
    int32_t prefill_tokens;        // min(max_batch_tokens, context 64, cache 30 * 4)
  };
  const std::vector<Case> cases = {
      {{96, 80, true}, true, {1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80}, 64},
      {{96, 80, true}, false, {1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80}, 64},
      {{6, 8, true}, true, {1, 2, 4, 6}, 6},  // max_batch_tokens below max_seqs caps the buckets
      {{1, 1, true}, true, {1}, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "max_batch_tokens " << c.limits.max_batch_tokens << ", max_seqs "
                                      << c.limits.max_seqs << ", device sampling " << c.device_sampling);
    RecordingCpuBackend backend;
    ModelRunner runner(spec, weights, backend, {30, 4}, c.limits);
    const WarmupReport report = runner.warm_up(c.device_sampling);
    EXPECT_EQ(report.decode_buckets, c.buckets);
    const int32_t expected_recordings = static_cast<int32_t>(c.buckets.size()) * (c.device_sampling ? 2 : 1);
    EXPECT_EQ(report.decode_recordings, expected_recordings);
    EXPECT_EQ(backend.num_recordings(), expected_recordings);
    EXPECT_EQ(report.prefill_tokens, c.prefill_tokens);
    EXPECT_GE(report.seconds, 0);

    // Decode steps of every size now replay warm-up's recordings: none is made anew.
    const int32_t max_seqs = std::min(c.limits.max_seqs, c.limits.max_batch_tokens);
    for (const int32_t seqs : {1, 3, max_seqs}) {
      if (seqs > max_seqs) continue;
      ForwardBatch batch;
      for (int32_t s = 0; s < seqs; ++s) {
        batch.token_ids.push_back(s + 1);
        batch.spans.push_back({1, 0, {s % 30}, true});
      }
      runner.forward(batch);
      if (c.device_sampling) runner.forward_sample(batch, std::vector<SamplingRow>(seqs));
    }
    EXPECT_EQ(backend.num_recordings(), expected_recordings);
  }

  // A runner told not to record runs the buckets eagerly: nothing recorded.
  RecordingCpuBackend backend;
  ModelRunner eager(spec, weights, backend, {30, 4}, {16, 4, false});
  const WarmupReport report = eager.warm_up();
  EXPECT_EQ(report.decode_buckets, (std::vector<int32_t>{1, 2, 4}));
  EXPECT_EQ(report.decode_recordings, 0);
  EXPECT_EQ(backend.num_recordings(), 0);
  EXPECT_EQ(report.prefill_tokens, 16);
}

// The same requests on a runner warmed up after a sequence is cached (its blocks include block 0,
// which warm-up's dummy spans read) and on one never warmed up: every output bit-identical, and
// the cached sequence continues exactly as before the warm-up.
TEST(WarmUp, LeavesTheCacheAndLaterOutputsUnchanged) {
  const ModelSpec spec = tiny_spec();
  const ModelWeights weights = random_weights(spec, DType::F32, 33);
  constexpr int32_t kBlockSize = 4, kBlocksPerSeq = 8, kSeqs = 3;
  const KvCacheConfig kv{kSeqs * kBlocksPerSeq, kBlockSize};
  const RunnerLimits limits{64, 8, true};
  RecordingCpuBackend warmed_backend, cold_backend;
  ModelRunner warmed(spec, weights, warmed_backend, kv, limits);
  ModelRunner cold(spec, weights, cold_backend, kv, limits);

  std::mt19937_64 rng(34);
  std::vector<std::vector<int32_t>> tokens(kSeqs), tables(kSeqs);
  std::vector<int32_t> lengths = {13, 5, 22};
  for (int s = 0; s < kSeqs; ++s) {
    tokens[s] = random_tokens(rng, 40, spec.vocab_size);
    tables[s] = iota_blocks(kBlocksPerSeq, s * kBlocksPerSeq);  // sequence 0 owns block 0
  }

  // Sequence 0's prompt, then two more tokens of it over the cached 13 (a two-token span runs
  // eagerly and reads every cached position): before and after the warm-up.
  const ForwardBatch prompt = single_span(tokens[0], 0, 13, tables[0], LogitsMode::All);
  EXPECT_TRUE(same_logits(warmed.forward(prompt), cold.forward(prompt)));
  const ForwardBatch continuation = single_span(tokens[0], 13, 2, tables[0], LogitsMode::All);
  const Tensor before = warmed.forward(continuation);
  const WarmupReport report = warmed.warm_up();
  ASSERT_GT(report.decode_recordings, 0);
  ASSERT_GT(report.prefill_tokens, 0);
  EXPECT_TRUE(same_logits(warmed.forward(continuation), before)) << "warm-up changed sequence 0's cache";
  EXPECT_TRUE(same_logits(cold.forward(continuation), before));

  // The other prompts, then decode steps of 3, 2, 1 and 3 sequences (buckets 4, 2, 1, 4), by
  // forward() and by forward_sample() (greedy and seeded temperature rows).
  for (int s = 1; s < kSeqs; ++s)
    EXPECT_TRUE(same_logits(warmed.forward(single_span(tokens[s], 0, lengths[s], tables[s], LogitsMode::Last)),
                            cold.forward(single_span(tokens[s], 0, lengths[s], tables[s], LogitsMode::Last))));
  lengths[0] = 15;
  int step = 0;
  for (const int active : {3, 2, 1, 3, 3}) {
    SCOPED_TRACE(::testing::Message() << "decode step " << step << ", " << active << " sequences");
    ForwardBatch batch;
    for (int s = 0; s < active; ++s) {
      batch.token_ids.push_back(tokens[s][lengths[s]]);
      batch.spans.push_back({1, lengths[s], tables[s], true});
    }
    const Tensor warmed_logits = warmed.forward(batch);
    const Tensor cold_logits = cold.forward(batch);
    ASSERT_EQ(warmed_logits.shape, (Shape{active, spec.vocab_size}));
    EXPECT_TRUE(same_logits(warmed_logits, cold_logits));
    std::vector<SamplingRow> rows(active);
    for (int s = 0; s < active; ++s)
      if (s % 2 == 1) rows[s] = SamplingRow{0.8f, 0, 1.0f, 0.0f, uint64_t(s) * 11, uint64_t(step)};
    EXPECT_EQ(warmed.forward_sample(batch, rows), cold.forward_sample(batch, rows));
    for (int s = 0; s < active; ++s) ++lengths[s];
    ++step;
  }
}

}  // namespace
}  // namespace splitflow::test
