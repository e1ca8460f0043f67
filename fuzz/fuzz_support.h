// fuzz/fuzz_support.h — what every harness shares: the input as a file the path-based loaders can
// open, the rule that a splitflow::Error is the expected end of a bad input, and a fixed exercise
// of a loaded Tokenizer.
//
// A harness built with -fsanitize=fuzzer (SPLITFLOW_FUZZ) is driven by libFuzzer; built without it
// (the normal build) it is linked with replay_main.cpp and replays its corpus and crash reproducers
// as a ctest test. Anything other than a splitflow::Error escaping a harness (another exception,
// an abort, a sanitizer report) is a crash.
#pragma once

#include "core/error.h"
#include "tokenizer/tokenizer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace splitflow::fuzz {

// One file per process whose contents each input replaces: a memfd reached through
// /proc/self/fd/<fd>, so MappedFile's open + mmap read it as any regular file without touching a
// disk. Where memfd_create is missing, a temporary file under /tmp does the same job.
class InputFile {
 public:
  InputFile() {
    fd_ = ::memfd_create("splitflow-fuzz-input", 0);
    if (fd_ >= 0) {
      path_ = "/proc/self/fd/" + std::to_string(fd_);
    } else {
      char pattern[] = "/tmp/splitflow-fuzz-XXXXXX";
      fd_ = ::mkstemp(pattern);
      if (fd_ < 0) std::abort();
      path_ = pattern;
    }
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  // Replaces the contents with `data` and returns the path. Every mapping of the previous
  // contents must be gone (a shrunk file under a live mapping would fault).
  const std::string& write(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0) std::abort();
    size_t written = 0;
    while (written < size) {
      const ssize_t n = ::pwrite(fd_, data + written, size - written, static_cast<off_t>(written));
      if (n <= 0) std::abort();
      written += static_cast<size_t>(n);
    }
    return path_;
  }

 private:
  int fd_ = -1;
  std::string path_;
};

// The process's one input file.
inline InputFile& input_file() {
  static InputFile file;
  return file;
}

// SPLITFLOW_FUZZ_VERBOSE set: print each refusal (to see why a seed does not load).
inline bool verbose() {
  static const bool on = std::getenv("SPLITFLOW_FUZZ_VERBOSE") != nullptr;
  return on;
}

// Runs `body`; a splitflow::Error is how a parser refuses bad input, so it ends the run quietly.
template <typename Body>
void expect_error_or_success(Body&& body) {
  try {
    body();
  } catch (const Error& error) {
    if (verbose()) std::fprintf(stderr, "  refused: %s\n", error.what());
  }
}

// Text with ASCII, multi-byte UTF-8, digits, whitespace runs and a special-token look-alike: what
// a loaded tokenizer encodes and decodes in every tokenizer harness.
inline constexpr std::string_view kSampleText = "Hello world! 123 4567  \n\tcaf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 <s> </s> <|endoftext|> \xf0\x9f\x98\x80.";

// Uses every query of `tokenizer`: encode (with and without specials), decode, the stream decoder,
// token_bytes of the ids around the vocabulary's ends, the special ids.
inline void exercise_tokenizer(const Tokenizer& tokenizer) {
  const int32_t vocab_size = tokenizer.vocab_size();
  for (bool add_special : {false, true}) {
    const std::vector<int32_t> ids = tokenizer.encode(kSampleText, add_special);
    for (int32_t id : ids)
      if (id < 0 || id >= vocab_size) std::abort();  // encode produced an id outside its own vocabulary
    (void)tokenizer.decode(ids, false);
    (void)tokenizer.decode(ids, true);
    StreamDecoder stream(tokenizer, /*skip_special=*/false);
    for (int32_t id : ids) (void)stream.push(id);
    (void)stream.finish();
  }
  std::vector<int32_t> edges;
  for (int32_t id : {-1, 0, 1, 2, 3, vocab_size - 2, vocab_size - 1, vocab_size}) {
    (void)tokenizer.token_bytes(id);
    (void)tokenizer.is_special(id);
    edges.push_back(id);
  }
  (void)tokenizer.decode(edges, false);
  (void)tokenizer.decode(edges, true);
  (void)tokenizer.bos_id();
  (void)tokenizer.eos_ids();
  (void)tokenizer.token_id("a");
  (void)tokenizer.token_id("<s>");
}

}  // namespace splitflow::fuzz
