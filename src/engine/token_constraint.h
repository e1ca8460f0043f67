// engine/token_constraint.h — the engine's hook for constrained decoding (structured outputs):
// a per-sequence source of "which tokens may come next". The engine asks each constrained
// sequence for its mask before a step's logits are sampled, applies it (disallowed logits become
// -inf) and tells it the token drawn. What the constraint is (a grammar, a JSON schema) is not
// the engine's business: grammar/ implements this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

namespace splitflow {

// One sequence's constraint state. Used by one thread at a time (a step may compute several
// sequences' masks on a helper thread, each on its own object).
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets bit t (word t / 32) for every token allowed next, after zeroing `mask_words`
  // (ceil(vocab / 32) words). End-of-sequence tokens are the engine's: it allows them when
  // can_end() is true (or when the constraint allows nothing, so a dead end still finishes).
  virtual void fill_next_token_mask(std::span<uint32_t> mask_words) = 0;
  // The text so far is complete: EOS may come now.
  virtual bool can_end() const = 0;
  // Advances past the token drawn (never an EOS token). Throws splitflow::Error for a token the
  // mask did not allow.
  virtual void accept_token(int32_t token_id) = 0;
};

// What a request asks for, shared by its sequences and immutable: start() gives each sequence
// its own state. Compiled once per distinct constraint (grammar/constraint_cache.h).
class TokenConstraintSpec {
 public:
  virtual ~TokenConstraintSpec() = default;
  virtual std::unique_ptr<TokenConstraint> start() const = 0;
};

}  // namespace splitflow
