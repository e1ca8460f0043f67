// fuzz/fuzz_grammar.cpp — the structured-output sources compiled to a Grammar and walked: the first
// byte picks the source (0: GBNF, 1: a regular expression, 2: a JSON schema, as the server gets
// them from response_format / the grammar extension fields), the rest is its text. A compiled
// grammar's matcher then takes up to 32 bytes, each one next_bytes() allows (picked by the input's
// own bytes), checking that a refused byte leaves the state as it was and, every 8 steps, that up
// to 8 of the allowed bytes advance a copy of the matcher, with a token mask over a small fixed
// vocabulary filled each time.
// A GrammarError (what the server answers 400 with), a nlohmann::json error (likewise) or a
// splitflow::Error is a refusal; anything else is a crash.
#include "fuzz_support.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"

#include <nlohmann/json.hpp>

#include <memory>

namespace {

using namespace splitflow::grammar;

const TokenTrie& vocabulary() {
  static const TokenTrie trie(std::vector<std::string>{
      "", "{", "}", "\"", ":", ",", " ", "\n", "a", "ab", "abc", "0", "12", "-", ".", "e", "true", "null",
      "\"name\"", "[", "]", "\\", "\\u", "caf\xc3\xa9", "\xc3", "\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "x", "_", "@", "Z"});
  return trie;
}

void walk(const Grammar& compiled, const uint8_t* choices, size_t num_choices) {
  GrammarMatcher matcher(std::make_shared<const Grammar>(compiled));
  std::vector<uint32_t> mask((vocabulary().vocab_size() + 31) / 32);
  for (size_t step = 0; step < 32 && !matcher.is_finished(); ++step) {
    const ByteSet next = matcher.next_bytes();
    std::vector<uint8_t> allowed;
    for (int b = 0; b < 256; ++b)
      if (next.test(static_cast<uint8_t>(b))) allowed.push_back(static_cast<uint8_t>(b));
    if (step % 8 == 0) {
      std::fill(mask.begin(), mask.end(), 0u);
      matcher.fill_token_mask(vocabulary(), mask);
    }
    if (allowed.empty()) break;
    const uint8_t choice = num_choices ? choices[step % num_choices] : static_cast<uint8_t>(step);
    // A byte outside next_bytes() is refused and changes nothing.
    for (int b = choice;; b = (b + 1) & 255) {
      if (!next.test(static_cast<uint8_t>(b))) {
        const std::vector<int32_t> key = matcher.state_key();
        if (matcher.advance(static_cast<uint8_t>(b)) || matcher.state_key() != key) std::abort();
        break;
      }
      if (b == ((choice + 255) & 255)) break;  // every byte allowed
    }
    if (step % 8 == 0) {
      for (size_t i = 0; i < allowed.size(); i += (allowed.size() + 7) / 8) {
        GrammarMatcher copy = matcher;
        if (!copy.advance(allowed[i])) std::abort();  // next_bytes() promised it
      }
    }
    if (!matcher.advance(allowed[choice % allowed.size()])) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 3) {
      case 0: walk(parse_gbnf(text), data + 1, size - 1); break;
      case 1: walk(compile_regex(text), data + 1, size - 1); break;
      case 2: {
        const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (schema.is_discarded()) return 0;
        walk(parse_gbnf(json_schema_to_gbnf(schema)), data + 1, size - 1);
        break;
      }
    }
  } catch (const GrammarError& error) {
    if (splitflow::fuzz::verbose()) std::fprintf(stderr, "  refused: %s\n", error.what());
  } catch (const nlohmann::json::exception& error) {
    if (splitflow::fuzz::verbose()) std::fprintf(stderr, "  refused (json): %s\n", error.what());
  } catch (const splitflow::Error& error) {
    if (splitflow::fuzz::verbose()) std::fprintf(stderr, "  refused: %s\n", error.what());
  }
  return 0;
}
