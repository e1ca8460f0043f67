// CpuBackend::apply_token_mask: structured outputs' vocabulary masks (backend/backend.h).
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/thread_team.h"
#include "core/error.h"
#include "sampling/token_mask.h"


namespace splitflow::cpu {

void CpuBackend::apply_token_mask(const DeviceTensor& logits, const DeviceTensor& mask) {
  SF_CHECK(logits.dtype == DType::F32 && logits.shape.size() == 2, "cpu apply_token_mask: logits must be F32 [rows, vocab], got {} {}",
           dtype_name(logits.dtype), shape_str(logits.shape));
  const int64_t rows = logits.dim(0), vocab = logits.dim(1), words = (vocab + 31) / 32;
  SF_CHECK(mask.dtype == DType::I32 && mask.shape == Shape({rows, words}),
           "cpu apply_token_mask: mask must be I32 [{}, {}], got {} {}", rows, words, dtype_name(mask.dtype),
           shape_str(mask.shape));
  float* out = logits.as<float>();
  const auto* bits = static_cast<const uint32_t*>(mask.data);
  parallel_ranges(num_threads_, rows, rows > 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) mask_logits_row(out + r * vocab, bits + r * words, vocab);
  });
}

}  // namespace splitflow::cpu
