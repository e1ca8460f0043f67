// fuzz/fuzz_step_command.cpp — decode_step_call (runtime/step_command.h: the tensor-parallel
// leader's step messages as its followers read them) over the input as int32 words (a trailing
// partial word is dropped). A decoded call must encode back to as many words (flags come back as
// 0 or 1), and those decode and encode to themselves; a splitflow::Error is the refusal of a
// truncated or foreign message.
#include "fuzz_support.h"
#include "runtime/step_command.h"

#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace splitflow;
  std::vector<int32_t> words(size / sizeof(int32_t));
  if (!words.empty()) std::memcpy(words.data(), data, words.size() * sizeof(int32_t));
  fuzz::expect_error_or_success([&] {
    const StepCall call = decode_step_call(words);
    const std::vector<int32_t> encoded = encode_step_call(call);
    if (encoded.size() != words.size()) std::abort();  // the decoder dropped or invented a word
    if (encode_step_call(decode_step_call(encoded)) != encoded) std::abort();
  });
  return 0;
}
