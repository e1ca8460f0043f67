// fuzz/fuzz_llama2c_tokenizer.cpp — load_llama2c_tokenizer over arbitrary bytes (every entry of
// the file, and the first 259 + a count taken from the input, as a checkpoint header would give),
// then encode and decode.
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace splitflow;
  const std::string& path = fuzz::input_file().write(data, size);
  // The vocab size a checkpoint would pass: 0 reads every entry; else 259 .. 259 + 255.
  const int32_t header_vocab = size > 0 && data[size - 1] % 2 == 1 ? 259 + data[size - 1] : 0;
  for (int32_t vocab_size : {0, header_vocab}) {
    fuzz::expect_error_or_success([&] {
      const auto tokenizer = load_llama2c_tokenizer(path, vocab_size);
      fuzz::exercise_tokenizer(*tokenizer);
    });
    if (header_vocab == 0) break;
  }
  return 0;
}
