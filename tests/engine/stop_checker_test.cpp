// Stop strings over streamed text, stop tokens, EOS and max_tokens (OpenAI semantics).
#include "core/error.h"
#include "engine/stop_checker.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace splitflow {
namespace {

constexpr int32_t kEos = 2;

SamplingParams with_stops(std::vector<std::string> stops, int32_t max_tokens = 100) {
  SamplingParams params;
  params.stop = std::move(stops);
  params.max_tokens = max_tokens;
  return params;
}

std::string safe_text(const StopChecker& checker) { return checker.text().substr(0, checker.safe_bytes()); }

// Streams pieces as tokens 10, 11, ...; returns what a client would have received, checking that
// safe_bytes() never shrinks and that the emitted text never changes afterwards.
std::string stream(StopChecker& checker, const std::vector<std::string>& pieces) {
  std::string emitted;
  int32_t token = 10;
  for (const std::string& piece : pieces) {
    const size_t before = checker.safe_bytes();
    checker.append(token++, piece);
    EXPECT_GE(checker.safe_bytes(), before);
    EXPECT_EQ(checker.text().substr(0, emitted.size()), emitted);
    emitted = safe_text(checker);
    if (checker.finished()) break;
  }
  return emitted;
}

TEST(StopChecker, StopStringSplitAcrossThreeTokens) {
  StopChecker checker(with_stops({"END"}), std::vector<int32_t>{kEos});
  checker.append(10, "abc E");
  EXPECT_EQ(safe_text(checker), "abc ");  // "E" may start "END"
  checker.append(11, "N");
  EXPECT_EQ(safe_text(checker), "abc ");
  EXPECT_FALSE(checker.finished());
  checker.append(12, "Dxyz");
  EXPECT_TRUE(checker.finished());
  EXPECT_EQ(checker.finish_reason(), FinishReason::Stop);
  EXPECT_EQ(finish_reason_name(checker.finish_reason()), "stop");
  EXPECT_EQ(checker.text(), "abc ");
  EXPECT_EQ(checker.safe_bytes(), 4u);
  EXPECT_EQ(checker.matched_stop_string(), "END");
  EXPECT_EQ(checker.matched_stop_token(), -1);
  EXPECT_EQ(checker.num_tokens(), 3);
}

TEST(StopChecker, PartialMatchThatTurnsOutNotToBeAStop) {
  StopChecker checker(with_stops({"END"}), std::vector<int32_t>{kEos});
  checker.append(10, "The E");
  EXPECT_EQ(safe_text(checker), "The ");
  checker.append(11, "N");
  EXPECT_EQ(safe_text(checker), "The ");
  checker.append(12, "GLISH");
  EXPECT_FALSE(checker.finished());
  EXPECT_EQ(safe_text(checker), "The ENGLISH");
}

TEST(StopChecker, OverlappingPrefixIsFoundAtItsTrueStart) {
  // "aab" inside "aaab": the first candidate start fails, the match starts one byte later.
  StopChecker checker(with_stops({"aab"}), {});
  checker.append(10, "xa");
  EXPECT_EQ(safe_text(checker), "x");
  checker.append(11, "a");
  EXPECT_EQ(safe_text(checker), "x");
  checker.append(12, "a");
  EXPECT_EQ(safe_text(checker), "xa");  // only the last "aa" can still start "aab"
  checker.append(13, "b!");
  EXPECT_EQ(checker.text(), "xa");
  EXPECT_EQ(checker.finish_reason(), FinishReason::Stop);
}

TEST(StopChecker, MultipleStopStringsEarliestOccurrenceWins) {
  StopChecker checker(with_stops({"world", "lo w", "\n\n"}), {});
  EXPECT_EQ(stream(checker, {"hel", "lo world\n\n"}), "hel");
  EXPECT_EQ(checker.matched_stop_string(), "lo w");
  // The longest held-back prefix among all stop strings.
  StopChecker holding(with_stops({"rld", "world"}), {});
  holding.append(10, "hello wor");
  EXPECT_EQ(safe_text(holding), "hello ");
  holding.append(11, "m");
  EXPECT_EQ(safe_text(holding), "hello worm");
}

TEST(StopChecker, StopAtTheVeryStartGivesEmptyText) {
  StopChecker checker(with_stops({"###"}), {});
  checker.append(10, "###");
  EXPECT_TRUE(checker.finished());
  EXPECT_EQ(checker.text(), "");
  EXPECT_EQ(checker.safe_bytes(), 0u);
  StopChecker split(with_stops({"###"}), {});
  EXPECT_EQ(stream(split, {"#", "#", "#tail"}), "");
}

TEST(StopChecker, StopStringInsideOneTokenWithTextAfterIt) {
  StopChecker checker(with_stops({"</s>"}), {});
  checker.append(10, "foo</s>bar");
  EXPECT_EQ(checker.text(), "foo");
  EXPECT_EQ(checker.finish_reason(), FinishReason::Stop);
}

TEST(StopChecker, EosAndStopTokensFinishWithoutTheirText) {
  StopChecker eos(SamplingParams{}, std::vector<int32_t>{kEos});
  eos.append(10, "hi");
  eos.append(kEos, "</s>");
  EXPECT_EQ(eos.finish_reason(), FinishReason::Stop);
  EXPECT_EQ(eos.text(), "hi");
  EXPECT_EQ(eos.safe_bytes(), 2u);
  EXPECT_EQ(eos.matched_stop_token(), kEos);
  EXPECT_EQ(eos.num_tokens(), 2);

  SamplingParams params;
  params.stop_token_ids = {7};
  StopChecker stop_token(params, std::vector<int32_t>{kEos});
  stop_token.append(7, "<|im_end|>");
  EXPECT_EQ(stop_token.finish_reason(), FinishReason::Stop);
  EXPECT_EQ(stop_token.text(), "");
}

TEST(StopChecker, IgnoreEosKeepsGoingButStopTokenIdsStillStop) {
  SamplingParams params;
  params.ignore_eos = true;
  params.stop_token_ids = {7};
  StopChecker checker(params, std::vector<int32_t>{kEos});
  checker.append(kEos, "</s>");
  EXPECT_FALSE(checker.finished());
  EXPECT_EQ(checker.text(), "</s>");
  checker.append(7, "");
  EXPECT_EQ(checker.finish_reason(), FinishReason::Stop);
}

TEST(StopChecker, MaxTokensGivesLengthAndReleasesHeldText) {
  StopChecker checker(with_stops({"STOP"}, 3), std::vector<int32_t>{kEos});
  checker.append(10, "a");
  checker.append(11, "b");
  EXPECT_FALSE(checker.finished());
  checker.append(12, " ST");
  EXPECT_EQ(checker.finish_reason(), FinishReason::Length);
  EXPECT_EQ(finish_reason_name(checker.finish_reason()), "length");
  EXPECT_EQ(safe_text(checker), "ab ST");  // no more tokens: the held-back "ST" is final text
}

TEST(StopChecker, StopOnTheLastAllowedTokenIsStopNotLength) {
  StopChecker checker(with_stops({"."}, 2), {});
  checker.append(10, "Hi");
  checker.append(11, ".");
  EXPECT_EQ(checker.finish_reason(), FinishReason::Stop);
  EXPECT_EQ(checker.text(), "Hi");
  StopChecker eos(with_stops({}, 1), std::vector<int32_t>{kEos});
  eos.append(kEos, "");
  EXPECT_EQ(eos.finish_reason(), FinishReason::Stop);
}

TEST(StopChecker, FinalTextIsScannedWithoutRewritingReleasedText) {
  StopChecker checker(with_stops({"END"}, 2), {});
  checker.append(10, "x");
  checker.append(11, "E");
  ASSERT_EQ(checker.finish_reason(), FinishReason::Length);
  ASSERT_EQ(safe_text(checker), "xE");  // already streamed: a stop may not reach back into it
  checker.append_final_text("ND-END-");
  EXPECT_EQ(checker.finish_reason(), FinishReason::Stop);
  EXPECT_EQ(checker.text(), "xEND-");
  EXPECT_EQ(checker.safe_bytes(), 5u);
  StopChecker plain(with_stops({"END"}, 1), {});
  plain.append(10, "x");
  plain.append_final_text("\xEF\xBF\xBD");
  EXPECT_EQ(plain.finish_reason(), FinishReason::Length);
  EXPECT_EQ(safe_text(plain), "x\xEF\xBF\xBD");
}

TEST(StopChecker, MultibyteStopStringHoldsWholeCharacters) {
  StopChecker checker(with_stops({"。结束"}), {});
  checker.append(10, "好。");
  EXPECT_EQ(safe_text(checker), "好");
  checker.append(11, "结");
  EXPECT_EQ(safe_text(checker), "好");
  checker.append(12, "果");
  EXPECT_EQ(safe_text(checker), "好。结果");
}

TEST(StopChecker, MisuseIsAnError) {
  StopChecker checker(with_stops({}, 1), {});
  EXPECT_THROW(checker.append_final_text("x"), Error);
  checker.append(10, "a");
  EXPECT_THROW(checker.append(11, "b"), Error);
  EXPECT_THROW(StopChecker(with_stops({""}), {}), Error);
}

}  // namespace
}  // namespace splitflow
