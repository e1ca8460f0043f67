// fuzz/fuzz_safetensors.cpp — open_safetensors over arbitrary bytes, then every tensor's name,
// dtype, shape, byte count and first/last data byte (a view must lie inside the file).
#include "formats/weight_source.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace splitflow;
  fuzz::expect_error_or_success([&] {
    const auto source = open_safetensors(fuzz::input_file().write(data, size));
    uint64_t checksum = source->metadata().size();
    for (const TensorInfo& info : source->tensors()) {
      checksum += info.name.size() + info.tensor.shape.size() + static_cast<uint64_t>(info.tensor.dtype);
      const size_t nbytes = info.tensor.nbytes();
      if (nbytes > size) std::abort();  // a tensor larger than the file it came from
      if (nbytes > 0) {
        const auto* bytes = static_cast<const uint8_t*>(info.tensor.data);
        checksum += bytes[0] + bytes[nbytes - 1];
      }
      (void)source->find(info.name);
    }
    volatile uint64_t sink = checksum;
    (void)sink;
  });
  return 0;
}
