// engine/constrained_step.h: the masks of a step's constrained rows on the helper thread kept across
// steps; each row's previous draw accepted before its mask; a constraint's failure rethrown on the
// caller's thread and the helper still serving the next step; settle() and destruction waiting
// for a running job. The constraints here are test doubles whose allowed tokens are written out.
#include "core/error.h"
#include "engine/constrained_step.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

using namespace splitflow;

namespace {

constexpr int32_t kVocab = 70;  // three words of mask, the last one partial
constexpr int32_t kEos = 69;

// Allows the tokens [accepted, accepted + 3) where `accepted` counts the tokens accepted so far;
// can end after 2 accepts; refuses (throws on) token 13.
class CountingConstraint : public TokenConstraint {
 public:
  explicit CountingConstraint(std::chrono::milliseconds delay = {}) : delay_(delay) {}
  void fill_next_token_mask(std::span<uint32_t> mask) override {
    std::this_thread::sleep_for(delay_);
    std::fill(mask.begin(), mask.end(), 0u);
    for (int t = accepted_; t < accepted_ + 3; ++t) mask[t / 32] |= 1u << (t % 32);
    filled = true;
  }
  bool can_end() const override { return accepted_ >= 2; }
  void accept_token(int32_t token) override {
    SF_CHECK(token != 13, "token 13 is not allowed");
    history.push_back(token);
    ++accepted_;
  }
  std::vector<int32_t> history;
  std::atomic<bool> filled = false;

 private:
  std::chrono::milliseconds delay_;
  int accepted_ = 0;
};

std::vector<int32_t> allowed(std::span<const uint32_t> mask) {
  std::vector<int32_t> tokens;
  for (int32_t t = 0; t < kVocab; ++t)
    if (mask[t / 32] >> (t % 32) & 1u) tokens.push_back(t);
  return tokens;
}

}  // namespace

TEST(ConstrainedStep, MasksFollowEachRowsAcceptedTokensAcrossSteps) {
  ConstrainedStep step;
  CountingConstraint a, b;
  const std::vector<int32_t> eos = {kEos};
  step.start({&a, nullptr, &b}, kVocab, eos);
  ASSERT_TRUE(step.any());
  EXPECT_EQ(allowed(step.mask(0)), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(allowed(step.mask(1)).size(), static_cast<size_t>(kVocab)) << "an unconstrained row allows everything";
  EXPECT_EQ(allowed(step.mask(2)), (std::vector<int32_t>{0, 1, 2}));

  // Next steps: row 0 drew 5 then 6 (accepted before its mask, on the helper), row 2 drew nothing.
  step.start({&a, nullptr, &b}, kVocab, eos, {5, std::nullopt, std::nullopt});
  EXPECT_EQ(allowed(step.mask(0)), (std::vector<int32_t>{1, 2, 3}));
  step.start({&a, &b}, kVocab, eos, {6, 40});
  EXPECT_EQ(allowed(step.mask(0)), (std::vector<int32_t>{2, 3, 4, kEos})) << "can end after two accepts: EOS allowed";
  EXPECT_EQ(allowed(step.mask(1)), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(a.history, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(b.history, (std::vector<int32_t>{40}));
  const std::span<const uint32_t> all = step.all_masks();
  EXPECT_EQ(all.size(), 2u * ((kVocab + 31) / 32));
}

TEST(ConstrainedStep, AFailedAcceptIsRethrownOnTheCallerAndTheHelperGoesOn) {
  ConstrainedStep step;
  CountingConstraint a;
  const std::vector<int32_t> eos = {kEos};
  step.start({&a}, kVocab, eos, {13});
  try {
    (void)step.all_masks();
    ADD_FAILURE() << "no error for a refused token";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 13 is not allowed"), std::string::npos) << e.what();
  }
  step.start({&a}, kVocab, eos, {7});
  EXPECT_EQ(allowed(step.mask(0)), (std::vector<int32_t>{1, 2, 3}));

  step.start({&a}, kVocab, eos, {13});
  step.settle();  // waits, drops the failure: a step that ended some other way
  step.start({&a}, kVocab, eos);
  EXPECT_EQ(allowed(step.mask(0)), (std::vector<int32_t>{1, 2, 3})) << "the refused tokens were not accepted";
  EXPECT_EQ(a.history, (std::vector<int32_t>{7}));
}

TEST(ConstrainedStep, SettleAndDestructionWaitForARunningJob) {
  CountingConstraint slow(std::chrono::milliseconds(50));
  const std::vector<int32_t> eos = {kEos};
  {
    ConstrainedStep step;
    step.start({&slow}, kVocab, eos);
    step.settle();
    EXPECT_TRUE(slow.filled);
  }
  CountingConstraint slow_too(std::chrono::milliseconds(50));
  {
    ConstrainedStep step;
    step.start({&slow_too}, kVocab, eos);
  }  // destroyed with the job running: waits for it
  EXPECT_TRUE(slow_too.filled);
}
