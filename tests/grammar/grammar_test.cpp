// Hand-written accept/reject cases for the GBNF parser, the byte matcher, regexes, JSON schemas
// and the token mask; expectations come from the formats' definitions, not from the code.
#include "grammar/constraint_cache.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "grammar/token_mask.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <memory>

namespace splitflow::grammar {
namespace {

bool matches(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.advance(text) && m.can_end();
}
bool is_prefix(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.advance(text);
}
std::shared_ptr<const Grammar> gbnf(std::string_view text) { return std::make_shared<const Grammar>(parse_gbnf(text)); }
std::shared_ptr<const Grammar> regex(std::string_view text) { return std::make_shared<const Grammar>(compile_regex(text)); }
std::shared_ptr<const Grammar> schema(const nlohmann::ordered_json& s) {
  return std::make_shared<const Grammar>(parse_gbnf(json_schema_to_gbnf(s)));
}

std::string gbnf_error(std::string_view text) {
  try {
    parse_gbnf(text);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

TEST(Gbnf, LiteralsAlternativesGroupsRepetitions) {
  auto g = gbnf(R"(root ::= "a" ( "b" | "cd" )* "e"? [0-9]{2,3})");
  EXPECT_TRUE(matches(g, "a12"));
  EXPECT_TRUE(matches(g, "abcdbe123"));
  EXPECT_FALSE(matches(g, "a1"));
  EXPECT_FALSE(matches(g, "a1234"));
  EXPECT_FALSE(matches(g, "ac12"));
  EXPECT_TRUE(is_prefix(g, "abc"));
  EXPECT_FALSE(is_prefix(g, "b"));
}

TEST(Gbnf, MultiLineRulesCommentsAndReferences) {
  auto g = gbnf(R"(# a list of words
root ::= word ("," ws word)*
word ::= [a-z]+   # letters
ws ::= " "?
)");
  EXPECT_TRUE(matches(g, "ab, cd,ef"));
  EXPECT_FALSE(matches(g, "ab,"));
  EXPECT_FALSE(matches(g, "Ab"));
}

TEST(Gbnf, NegatedClassesAndUnicodeAreMatchedAsUtf8Bytes) {
  auto g = gbnf(R"(root ::= "\"" [^"\\]* "\"")");
  EXPECT_TRUE(matches(g, "\"h\xC3\xA9llo \xF0\x9F\x98\x80\""));  // é and an emoji
  EXPECT_FALSE(matches(g, "\"a\"b\""));
  EXPECT_FALSE(matches(g, "\"\xC3\""));  // a lone lead byte is not a character
  auto greek = gbnf(R"(root ::= [α-ω]+)");
  EXPECT_TRUE(matches(greek, "\xCE\xB1\xCE\xB2"));  // αβ
  EXPECT_FALSE(matches(greek, "a"));
  EXPECT_TRUE(is_prefix(greek, "\xCE"));  // half a character is a viable prefix
  auto any = gbnf(R"(root ::= . .)");
  EXPECT_TRUE(matches(any, "a\xE2\x82\xAC"));  // a€
  EXPECT_FALSE(matches(any, "a\xED\xA0\x80"));  // an encoded surrogate is not UTF-8
}

TEST(Gbnf, ErrorsNameTheProblem) {
  EXPECT_NE(gbnf_error("root ::= foo").find("undefined rule 'foo'"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= \"a").find("unterminated string"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= [a-").find("line 1"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= root \"a\" | \"a\"").find("left recursion"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= (\"a\"?)*").find("without matching"), std::string::npos);
  EXPECT_NE(gbnf_error("start ::= \"a\"").find("no 'root' rule"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= \"a\" )").find("unmatched ')'"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= \"\\q\"").find("unknown escape"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= \"a\"{3,2}").find("max < min"), std::string::npos);
  EXPECT_NE(gbnf_error("root := \"a\"").find("expected '::='"), std::string::npos);
}

TEST(Utf8, SequencesCoverRangesExactly) {
  // Every code point of a range crossing all encoding lengths is matched by exactly one sequence.
  const auto sequences = utf8_sequences(0x70, 0x10010);
  size_t total = 0;
  for (const auto& seq : sequences) {
    size_t count = 1;
    for (const auto& [lo, hi] : seq) count *= static_cast<size_t>(hi - lo + 1);
    total += count;
  }
  EXPECT_EQ(total, 0x10010 - 0x70 + 1 - 0x800);  // surrogates excluded
}

TEST(Regex, OwnCases) {
  struct Case {
    const char* pattern;
    std::vector<std::string> accept, reject;
  };
  const std::vector<Case> cases = {
      {R"(^\d{3}-\d{4}$)", {"555-1234"}, {"5551234", "55-1234", "555-12345"}},
      {R"([A-Z][a-z]+( [A-Z][a-z]+)*)", {"Ada", "Ada Lovelace"}, {"ada", "Ada ", "A"}},
      {R"((cat|dog)s?)", {"cat", "dogs"}, {"cow", "cats!"}},
      {R"(\w+@\w+\.(com|org))", {"a_b@x.com", "z@q.org"}, {"@x.com", "a@x.net"}},
      {R"(a.c)", {"abc", "a-c"}, {"a\nc", "ac"}},
      {R"([^0-9\s]{2})", {"ab", "\xC3\xA9!"}, {"a1", "a "}},
      {R"(x{2,}y?)", {"xx", "xxxxy"}, {"x", "xy"}},
      {R"((?:ab)+?\.)", {"ab.", "abab."}, {".", "aba."}},
      {R"(\$\d+\.\d\d)", {"$3.50"}, {"3.50", "$3.5"}},
  };
  for (const Case& c : cases) {
    auto g = regex(c.pattern);
    for (const auto& text : c.accept) EXPECT_TRUE(matches(g, text)) << c.pattern << " should match " << text;
    for (const auto& text : c.reject) EXPECT_FALSE(matches(g, text)) << c.pattern << " should not match " << text;
  }
}

TEST(Regex, UnsupportedConstructsAreNamed) {
  auto error = [](const char* pattern) {
    try {
      compile_regex(pattern);
    } catch (const GrammarError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error(R"((a)\1)").find("backreferences"), std::string::npos);
  EXPECT_NE(error(R"(a(?=b))").find("lookahead"), std::string::npos);
  EXPECT_NE(error(R"(\bword)").find("word boundaries"), std::string::npos);
  EXPECT_NE(error(R"((?i)abc)").find("inline flags"), std::string::npos);
  EXPECT_NE(error(R"(a**)").find("quantifier follows"), std::string::npos);
  EXPECT_NE(error(R"((ab)").find("missing ')'"), std::string::npos);
}

TEST(JsonSchema, ObjectWithRequiredAndOptionalProperties) {
  auto g = schema({{"type", "object"},
                   {"properties",
                    {{"name", {{"type", "string"}}}, {"age", {{"type", "integer"}}}, {"tags", {{"type", "array"}, {"items", {{"type", "string"}}}}}}},
                   {"required", {"name"}},
                   {"additionalProperties", false}});
  EXPECT_TRUE(matches(g, R"({"name":"x"})"));
  EXPECT_TRUE(matches(g, R"({ "name": "x", "age": -12, "tags": ["a", "b"] })"));
  EXPECT_TRUE(matches(g, R"({"name":"x","tags":[]})"));
  EXPECT_FALSE(matches(g, R"({"age":1})"));                  // name is required
  EXPECT_FALSE(matches(g, R"({"name":"x","age":1.5})"));     // integer
  EXPECT_FALSE(matches(g, R"({"name":"x","other":1})"));     // additionalProperties false
  EXPECT_FALSE(matches(g, R"({"name":"x",})"));              // trailing comma
  EXPECT_FALSE(matches(g, R"({"age":1,"name":"x"})"));       // properties in the schema's order
}

TEST(JsonSchema, EnumConstAnyOfRefsAndFormats) {
  nlohmann::ordered_json s = {{"$defs", {{"point", {{"type", "object"}, {"properties", {{"x", {{"type", "number"}}}}}, {"required", {"x"}}}}}},
                      {"type", "object"},
                      {"properties",
                       {{"kind", {{"enum", {"a", "b", 3, nullptr}}}},
                        {"v", {{"const", "fixed"}}},
                        {"p", {{"anyOf", {{{"$ref", "#/$defs/point"}}, {{"type", "null"}}}}}},
                        {"day", {{"type", "string"}, {"format", "date"}}},
                        {"code", {{"type", "string"}, {"pattern", "^[A-Z]{2}[0-9]$"}}},
                        {"short", {{"type", "string"}, {"maxLength", 3}}}}},
                      {"required", {"kind", "v", "p", "day", "code", "short"}}};
  auto g = schema(s);
  EXPECT_TRUE(matches(g, R"({"kind":"a","v":"fixed","p":{"x":1.5e3},"day":"2024-02-29","code":"AB1","short":"abc"})"));
  EXPECT_TRUE(matches(g, R"({"kind":3,"v":"fixed","p":null,"day":"2024-12-01","code":"ZZ0","short":""})"));
  EXPECT_TRUE(matches(g, R"({"kind":null,"v":"fixed","p":null,"day":"2024-12-01","code":"ZZ0","short":""})"));
  EXPECT_FALSE(matches(g, R"({"kind":"c","v":"fixed","p":null,"day":"2024-12-01","code":"ZZ0","short":""})"));
  EXPECT_FALSE(matches(g, R"({"kind":"a","v":"other","p":null,"day":"2024-12-01","code":"ZZ0","short":""})"));
  EXPECT_FALSE(matches(g, R"({"kind":"a","v":"fixed","p":null,"day":"2024-13-01","code":"ZZ0","short":""})"));
  EXPECT_FALSE(matches(g, R"({"kind":"a","v":"fixed","p":null,"day":"2024-12-01","code":"Z00","short":""})"));
  EXPECT_FALSE(matches(g, R"({"kind":"a","v":"fixed","p":null,"day":"2024-12-01","code":"ZZ0","short":"abcd"})"));
}

TEST(JsonSchema, RecursiveRefs) {
  nlohmann::ordered_json s = {{"type", "object"},
                      {"properties", {{"value", {{"type", "integer"}}}, {"children", {{"type", "array"}, {"items", {{"$ref", "#"}}}}}}},
                      {"required", {"value", "children"}}};
  auto g = schema(s);
  EXPECT_TRUE(matches(g, R"({"value":1,"children":[{"value":2,"children":[]}]})"));
  EXPECT_FALSE(matches(g, R"({"value":1,"children":[{"value":2}]})"));
}

TEST(JsonSchema, UnsupportedFeaturesAreNamedWithTheirPath) {
  auto error = [](const nlohmann::ordered_json& s) {
    try {
      json_schema_to_gbnf(s);
    } catch (const GrammarError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error({{"type", "object"}, {"properties", {{"n", {{"type", "integer"}, {"minimum", 0}}}}}}).find("'#/properties/n': 'minimum' is not supported"),
            std::string::npos);
  EXPECT_NE(error({{"type", "object"}, {"patternProperties", nlohmann::ordered_json::object()}}).find("'patternProperties' is not supported"),
            std::string::npos);
  EXPECT_NE(error({{"oneOf", nlohmann::ordered_json::array()}}).find("'oneOf'"), std::string::npos);
  EXPECT_NE(error({{"$ref", "http://x/y"}}).find("only local references"), std::string::npos);
  EXPECT_NE(error({{"type", "string"}, {"format", "ipv6"}}).find("string format 'ipv6'"), std::string::npos);
  EXPECT_NE(error({{"type", "wat"}}).find("unknown type 'wat'"), std::string::npos);
}

TEST(JsonObject, AnyObject) {
  auto g = std::make_shared<const Grammar>(parse_gbnf(json_object_gbnf()));
  EXPECT_TRUE(matches(g, R"({})"));
  EXPECT_TRUE(matches(g, R"({"a": [1, {"b": null}, "x\n\u00e9"], "c": true})"));
  EXPECT_FALSE(matches(g, R"([1])"));
  EXPECT_FALSE(matches(g, R"({"a": 01})"));
  EXPECT_FALSE(matches(g, R"({"a": "tab	in string"})"));  // a raw control character
  GrammarMatcher m(g);
  ASSERT_TRUE(m.advance("{}"));
  EXPECT_TRUE(m.is_finished());  // nothing may follow the object
}

// A toy vocabulary: the token mask must equal checking every token alone.
TEST(TokenMask, TrieMaskEqualsCheckingEachToken) {
  std::vector<std::string> vocab = {"", "{", "}", "\"", "a", "ab", "\":", "{\"", "1", "12", " ", "\"}", "x\"", "null", "nu", ",", "\xC3", "\xA9", "\xC3\xA9"};
  auto vocabulary = std::make_shared<const TokenVocabulary>(vocab, false);
  auto g = std::make_shared<const Grammar>(parse_gbnf(json_object_gbnf()));
  auto compiled = std::make_shared<const CompiledGrammar>(g, vocabulary, static_cast<int32_t>(vocab.size()));
  GrammarMatcher state(g);
  for (const std::string prefix : {"", "{", "{\"", "{\"a", "{\"a\":", "{\"a\": n", "{\"a\":1", "{\"\xC3"}) {
    GrammarMatcher m(g);
    ASSERT_TRUE(m.advance(prefix)) << prefix;
    std::vector<uint32_t> mask(compiled->mask_words(), 0);
    compiled->fill_mask(m, false, mask);
    for (size_t id = 0; id < vocab.size(); ++id) {
      GrammarMatcher alone(g);
      alone.advance(prefix);
      const bool expected = !vocab[id].empty() && alone.advance(vocab[id]);
      EXPECT_EQ(((mask[id / 32] >> (id % 32)) & 1u) != 0, expected) << "prefix '" << prefix << "' token '" << vocab[id] << "'";
    }
  }
  // The same state again is a cache hit with the same mask.
  GrammarMatcher m(g);
  m.advance("{");
  std::vector<uint32_t> first(compiled->mask_words()), second(compiled->mask_words());
  compiled->fill_mask(m, false, first);
  const auto before = compiled->cache_stats();
  compiled->fill_mask(m, false, second);
  EXPECT_EQ(compiled->cache_stats().hits, before.hits + 1);
  EXPECT_EQ(first, second);
}

TEST(TokenMask, FirstTokenWithoutItsLeadingSpace) {
  // SentencePiece drops the first piece's leading space: " {" must count as "{" first.
  std::vector<std::string> vocab = {" {", "{", "}", " }"};
  auto vocabulary = std::make_shared<const TokenVocabulary>(vocab, true);
  auto g = std::make_shared<const Grammar>(parse_gbnf(R"(root ::= "{}")"));
  auto compiled = std::make_shared<CompiledGrammar>(g, vocabulary, 4);
  auto constraint = compiled->start();
  std::vector<uint32_t> mask(1);
  constraint->fill_next_token_mask(mask);
  EXPECT_EQ(mask[0], 0b0011u);
  constraint->accept_token(0);
  constraint->fill_next_token_mask(mask);
  EXPECT_EQ(mask[0], 0b0100u);  // " }" is not "}" after the first token
  constraint->accept_token(2);
  EXPECT_TRUE(constraint->can_end());
}

// Found while fuzzing (fuzz_grammar; reproducers in fuzz/crashes/grammar/): every one of these
// recursed once per level and overflowed the stack (the server's, for a request's grammar, regex
// or schema) instead of failing the request.
std::string repeat(std::string_view piece, size_t n) {
  std::string out;
  out.reserve(piece.size() * n);
  for (size_t i = 0; i < n; ++i) out += piece;
  return out;
}

TEST(HostileSources, DeepNestingIsAnErrorNotAStackOverflow) {
  EXPECT_NE(gbnf_error("root ::= " + repeat("(", 200000) + "\"a\"" + repeat(")", 200000)).find("nest deeper than"),
            std::string::npos);
  try {
    compile_regex(repeat("(", 200000) + "a" + repeat(")", 200000));
    ADD_FAILURE() << "a regex 200,000 groups deep compiled";
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("nest deeper than"), std::string::npos) << e.what();
  }
  const auto schema_error = [](const nlohmann::ordered_json& s) {
    try {
      json_schema_to_gbnf(s);
    } catch (const GrammarError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // Nested schemas, as a server parses a schema sent as a string (no depth cap on that parse).
  const auto nested = nlohmann::ordered_json::parse(repeat("{\"items\":", 100000) + "{}" + repeat("}", 100000));
  EXPECT_NE(schema_error(nested).find("nest deeper than"), std::string::npos);
  // A chain of $ref, each to the next definition.
  nlohmann::ordered_json chain = {{"$ref", "#/$defs/d0"}, {"$defs", nlohmann::ordered_json::object()}};
  for (int i = 0; i < 3000; ++i) chain["$defs"][fmt::format("d{}", i)] = {{"$ref", fmt::format("#/$defs/d{}", i + 1)}};
  chain["$defs"]["d3000"] = {{"type", "string"}};
  EXPECT_NE(schema_error(chain).find("nest deeper than"), std::string::npos);
  // Within the caps all is as before.
  EXPECT_TRUE(matches(gbnf("root ::= " + repeat("(", 900) + "\"a\"" + repeat(")", 900)), "a"));
  EXPECT_TRUE(matches(regex(repeat("(", 150) + "a" + repeat(")", 150)), "a"));
}

TEST(HostileSources, LongRuleChainsAndRunsOfEmptyMatchesAreNoDeeperOnTheStack) {
  // 100,000 rules, each only a reference to the next: the left-recursion check walked them recursively.
  std::string chain = "root ::= r0\n";
  for (int i = 0; i < 100000; ++i) chain += fmt::format("r{} ::= r{}\n", i, i + 1);
  chain += "r100000 ::= \"a\"\n";
  const auto g = gbnf(chain);
  EXPECT_TRUE(matches(g, "a"));
  EXPECT_FALSE(matches(g, "b"));
  // 100,000 references to a rule that may match nothing: the matcher's expansion recursed once
  // per reference. Now it is the "too ambiguous" error it always was meant to be.
  try {
    GrammarMatcher matcher(gbnf("root ::= " + repeat("x ", 100000) + "\"a\"\nx ::= \"b\"?\n"));
    ADD_FAILURE() << "100,000 optional 'b' before an 'a' is not too ambiguous";
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("too ambiguous"), std::string::npos) << e.what();
  }
  // A few of them still match as before.
  const auto few = gbnf("root ::= x x x \"a\"\nx ::= \"b\"?\n");
  EXPECT_TRUE(matches(few, "a"));
  EXPECT_TRUE(matches(few, "bba"));
  EXPECT_FALSE(matches(few, "bbbba"));
}

}  // namespace
}  // namespace splitflow::grammar
