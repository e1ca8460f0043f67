// fuzz/fuzz_hf_tokenizer.cpp — load_hf_tokenizer over an arbitrary tokenizer.json (no
// tokenizer_config.json beside it), then encode and decode a fixed text.
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace splitflow;
  fuzz::expect_error_or_success([&] {
    const auto tokenizer = load_hf_tokenizer(fuzz::input_file().write(data, size));
    fuzz::exercise_tokenizer(*tokenizer);
  });
  return 0;
}
