// fuzz/fuzz_openai_request.cpp — an HTTP request body through parse_json_body, then both
// parse_completion_request and parse_chat_request. An ApiError with a 4xx status is the parsers'
// answer to a bad body (the server sends it as is), a splitflow::Error the library's; an ApiError
// of another status or any other exception is a crash.
#include "fuzz_support.h"
#include "server/openai_api.h"

namespace {

template <typename Parse>
void expect_client_error_or_success(Parse&& parse) {
  try {
    parse();
  } catch (const splitflow::ApiError& error) {
    if (error.status < 400 || error.status >= 500) std::abort();
    if (splitflow::fuzz::verbose()) std::fprintf(stderr, "  refused (%d): %s\n", error.status, error.what());
    (void)splitflow::error_body(error);
  } catch (const splitflow::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace splitflow;
  expect_client_error_or_success([&] {
    const nlohmann::json body = parse_json_body(std::string(reinterpret_cast<const char*>(data), size));
    expect_client_error_or_success([&] {
      const splitflow::CompletionRequest request = parse_completion_request(body);
      request.params.validate();  // what the parser accepted, the engine accepts
    });
    expect_client_error_or_success([&] { (void)parse_chat_request(body); });
    (void)dump_json(body);
  });
  return 0;
}
