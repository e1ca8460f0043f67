// Unigram tokenizer.json files (T5, ALBERT and byte-fallback shapes, python/make_unigram_fixtures.py)
// against the ids and decodes HF tokenizers gave for them (expected.jsonl, written by the same
// script from HF, never from splitflow), plus the failure modes of the Unigram model and of the
// Precompiled charsmap. tests/python/test_hf_unigram.py covers more variants (XLM-R, nmt_nfkc_cf)
// and every code point through the normalizers at test time.
#include "test_paths.h"
#include "tokenizer/hf_components.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unigram.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace splitflow {
namespace {

using json = nlohmann::json;

struct Expected {
  std::string text;
  std::vector<int32_t> ids;
  std::vector<int32_t> ids_special;
  std::string decoded;
};

std::vector<Expected> read_expected(const std::string& directory) {
  std::ifstream in(directory + "/expected.jsonl");
  EXPECT_TRUE(in.good()) << directory;
  std::vector<Expected> out;
  for (std::string line; std::getline(in, line);) {
    const json record = json::parse(line);
    out.push_back({record["text"], record["ids"], record["ids_special"], record["decoded"]});
  }
  return out;
}

class UnigramFixture : public testing::TestWithParam<std::string> {};

TEST_P(UnigramFixture, EncodesAndDecodesAsHfTokenizers) {
  const std::string directory = test::fixture_path("tokenizer/unigram/" + GetParam());
  const auto tokenizer = load_tokenizer_for_model(directory);
  const auto cases = read_expected(directory);
  ASSERT_GT(cases.size(), 400u);
  size_t encoded = 0, decoded = 0;
  for (const auto& c : cases) {
    const auto ids = tokenizer->encode(c.text, false);
    EXPECT_EQ(ids, c.ids) << "text: '" << c.text << "'";
    EXPECT_EQ(tokenizer->encode(c.text, true), c.ids_special) << "text: '" << c.text << "'";
    const std::string text = tokenizer->decode(c.ids_special, true);
    EXPECT_EQ(text, c.decoded) << "ids of '" << c.text << "'";
    encoded += ids == c.ids;
    decoded += text == c.decoded;
  }
  std::printf("%s: %zu/%zu encodes and %zu/%zu decodes match HF tokenizers\n", GetParam().c_str(), encoded,
              cases.size(), decoded, cases.size());
}

INSTANTIATE_TEST_SUITE_P(Committed, UnigramFixture, testing::Values("t5", "albert", "byte_fallback"));

// The corpus has lines that must come back unchanged through HF's decode; so must ours (the
// fixture's expected text says which do: decoded == text).
TEST(Unigram, DecodeRoundTripsWhereHfDoes) {
  const std::string directory = test::fixture_path("tokenizer/unigram/byte_fallback");
  const auto tokenizer = load_tokenizer_for_model(directory);
  size_t round_trips = 0;
  for (const auto& c : read_expected(directory)) {
    if (c.decoded != c.text) continue;
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(c.text, true), true), c.text);
    ++round_trips;
  }
  EXPECT_GT(round_trips, 100u);
}

// A T5-shaped file: the special pieces and </s> appended by add_special. The vocabulary is 1000
// SentencePiece pieces, 100 <extra_id_N> and "<pad>" added after them (HF's get_vocab_size: 1101).
TEST(Unigram, SpecialTokensOfAT5File) {
  const auto t5 = load_tokenizer_for_model(test::fixture_path("tokenizer/unigram/t5"));
  EXPECT_EQ(t5->vocab_size(), 1101);
  EXPECT_EQ(t5->token_id("<pad>"), 1100);
  const int32_t eos = t5->token_id("</s>");
  ASSERT_GE(eos, 0);
  EXPECT_TRUE(t5->is_special(eos));
  EXPECT_EQ(t5->encode("", true), std::vector<int32_t>{eos});
  const int32_t extra = t5->token_id("<extra_id_0>");
  EXPECT_EQ(extra, 1099);
  const auto ids = t5->encode("a<extra_id_0>b", false);
  EXPECT_NE(std::find(ids.begin(), ids.end(), extra), ids.end());
}

std::vector<int32_t> unigram_encode(const UnigramModel& model, std::string_view text) {
  std::vector<int32_t> ids;
  model.encode(text, ids);
  return ids;
}

// Hand-checkable lattices: "ab" as one piece (-1) beats "a" + "b" (-1.5 + -1.5); unknown
// characters in a row fuse into one unk; byte fallback spells a piece the vocab lacks in <0xNN>.
TEST(Unigram, ViterbiFusesUnknownsAndFallsBackToBytes) {
  const UnigramModel plain({{"<unk>", 0.0}, {"a", -1.5}, {"b", -1.5}, {"ab", -1.0}, {"c", -4.0}}, 0, false, "test");
  EXPECT_EQ(unigram_encode(plain, "ab"), (std::vector<int32_t>{3}));
  EXPECT_EQ(unigram_encode(plain, "abc"), (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(unigram_encode(plain, "a\xC3\xA9\xC3\xA9" "b"), (std::vector<int32_t>{1, 0, 2}));
  EXPECT_EQ(unigram_encode(plain, ""), (std::vector<int32_t>{}));

  std::vector<std::pair<std::string, double>> pieces{{"<unk>", 0.0}, {"a", -1.0}};
  for (int b = 0; b < 256; ++b) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    pieces.push_back({std::string{'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'}, -10.0});
  }
  const UnigramModel bytes(pieces, 0, true, "test");
  // "é" is no piece: one fused unknown string, then its two bytes.
  EXPECT_EQ(unigram_encode(bytes, "a\xC3\xA9"), (std::vector<int32_t>{1, 2 + 0xC3, 2 + 0xA9}));
}

TEST(Unigram, ErrorsNameTheProblem) {
  EXPECT_THROW(UnigramModel({{"a", -1.0}}, 3, false, "test"), std::exception);
  EXPECT_THROW(UnigramModel({}, -1, false, "test"), std::exception);
  const UnigramModel no_unk({{"a", -1.0}}, -1, false, "test");
  EXPECT_EQ(unigram_encode(no_unk, "aa"), (std::vector<int32_t>{0, 0}));
  EXPECT_THROW(unigram_encode(no_unk, "ab"), std::exception);  // HF: unk_id is missing
}

std::string blob_of(const std::vector<uint32_t>& units, std::string_view strings) {
  std::string blob;
  const auto put = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) blob.push_back(char((v >> (8 * i)) & 0xFF));
  };
  put(uint32_t(units.size() * 4));
  for (uint32_t unit : units) put(unit);
  blob.append(strings);
  return blob;
}

// Damaged charsmaps are refused at load or never match; none reads outside the blob.
TEST(Unigram, PrecompiledCharsmapChecksItsBlob) {
  EXPECT_THROW(hf::PrecompiledCharsmap("\x01\x02", "test"), std::exception);               // no header
  EXPECT_THROW(hf::PrecompiledCharsmap(blob_of({0, 0}, "").substr(0, 8), "test"), std::exception);  // short trie
  EXPECT_THROW(hf::PrecompiledCharsmap(blob_of({0}, "\xFF\xFE"), "test"), std::exception);  // strings not UTF-8
  // A root whose offset points far outside the array: every lookup is a miss.
  const hf::PrecompiledCharsmap wild(blob_of({0xFFFFFC00u}, "x"), "test");
  EXPECT_EQ(wild.normalize("abc"), "abc");
  EXPECT_THROW(hf::base64_decode("ab$c", "test"), std::exception);
  EXPECT_EQ(hf::base64_decode("aGk=", "test"), "hi");
}

// The charsmap of the committed T5 fixture is SentencePiece's nmt_nfkc. These are NFKC facts
// (Unicode's tables), and the grapheme rule spm_precompiled applies: a cluster shorter than six
// bytes whose prefix is mapped is replaced whole (the combining mark after "Ａ" goes).
TEST(Unigram, NmtNfkcCharsmapOfT5Fixture) {
  std::ifstream in(test::fixture_path("tokenizer/unigram/t5/tokenizer.json"));
  const json spec = json::parse(in);
  const json& precompiled = spec["normalizer"]["normalizers"][0];
  ASSERT_EQ(precompiled["type"], "Precompiled");
  const hf::PrecompiledCharsmap map(hf::base64_decode(precompiled["precompiled_charsmap"].get<std::string>(), "t5"),
                                    "t5");
  EXPECT_EQ(map.normalize("\xEF\xAC\x81"), "fi");            // ﬁ
  EXPECT_EQ(map.normalize("\xEF\xBC\xA1"), "A");             // Ａ
  EXPECT_EQ(map.normalize("\xEF\xBC\xA1\xCC\x81"), "A");     // Ａ + U+0301: one cluster, mapped by its prefix
  EXPECT_EQ(map.normalize("plain ascii"), "plain ascii");
}

}  // namespace
}  // namespace splitflow
