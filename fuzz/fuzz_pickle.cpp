// fuzz/fuzz_pickle.cpp — open_pytorch (zip container and legacy layout) over arbitrary bytes, then
// every tensor's metadata and every data byte (a view must lie inside the file, a materialized
// strided view inside its storage); the same bytes also go straight to the restricted unpickler, so
// mutations reach the opcode decoder without first having to keep a zip intact.
#include "formats/pickle.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace splitflow;
  fuzz::expect_error_or_success([&] {
    const auto source = open_pytorch(fuzz::input_file().write(data, size));
    uint64_t checksum = source->metadata().size();
    for (const TensorInfo& info : source->tensors()) {
      checksum += info.name.size() + info.tensor.shape.size() + static_cast<uint64_t>(info.tensor.dtype);
      const auto* bytes = static_cast<const uint8_t*>(info.tensor.data);
      for (size_t i = 0; i < info.tensor.nbytes(); ++i) checksum += bytes[i];
      (void)source->find(info.name);
    }
    volatile uint64_t sink = checksum;
    (void)sink;
  });
  fuzz::expect_error_or_success([&] {
    const Pickle pickle = unpickle_restricted(data, size, "fuzz input");
    if (pickle.root >= pickle.objects.size() || pickle.bytes_read > size) std::abort();
    for (const PickleObject& object : pickle.objects)
      for (const uint32_t item : object.items)
        if (item >= pickle.objects.size()) std::abort();  // an index to an object that does not exist
  });
  return 0;
}
