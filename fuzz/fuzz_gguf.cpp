// fuzz/fuzz_gguf.cpp — open_gguf over arbitrary bytes, every tensor's metadata and first/last data
// byte, then the GGUF tokenizer from its metadata (when it has one), encoding and decoding.
#include "formats/weight_source.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace splitflow;
  fuzz::expect_error_or_success([&] {
    const auto source = open_gguf(fuzz::input_file().write(data, size));
    uint64_t checksum = 0;
    for (const TensorInfo& info : source->tensors()) {
      checksum += info.name.size() + info.tensor.shape.size() + static_cast<uint64_t>(info.tensor.dtype);
      const size_t nbytes = info.tensor.nbytes();
      if (nbytes > size) std::abort();  // a tensor larger than the file it came from
      if (nbytes > 0) {
        const auto* bytes = static_cast<const uint8_t*>(info.tensor.data);
        checksum += bytes[0] + bytes[nbytes - 1];
      }
    }
    volatile uint64_t sink = checksum;
    (void)sink;
    if (!source->metadata().contains("tokenizer.ggml.model")) return;
    const auto tokenizer = load_gguf_tokenizer(source->metadata());
    fuzz::exercise_tokenizer(*tokenizer);
  });
  return 0;
}
