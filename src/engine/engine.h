// engine/engine.h — the continuous-batching engine: many requests through one ModelRunner.
// Owns the Scheduler (and through it the KV BlockManager) and, per sequence, the Sampler (seeded),
// the StreamDecoder and the StopChecker. One step() is: the scheduler plans a batch, the runner
// runs it, each sampled span gets a token, the scheduler appends them, stop strings are checked
// on the released text. Single-threaded and synchronous: server/async_engine.h runs it on its
// own thread. It never touches sockets, JSON or clocks. A step that preempts by swapping (or
// readmits a swapped sequence) runs the scheduler's block copies on the runner before the forward.
//
// A request with n > 1 is n sequences over one prompt: the first is queued alone, the other n-1
// join at the front of the queue once the first has computed the prompt, so the prefix cache
// gives them its full blocks instead of computing the prompt n times.
// Seeds: a request's seed is params.seed, or, unseeded, one drawn from std::random_device once
// when it is added (so nothing later changes it). Choice i of n samples with seed + i (mod 2^64):
// choice i of a request seeded s gives what a one-choice request seeded s + i gives.
//
// Where tokens are drawn: a sequence whose parameters the sampling rule covers (temperature,
// top_k, top_p, min_p; no logprobs, penalties, FSD, mirostat, typical or tail-free) is sampled on
// the device by ModelRunner::forward_sample, so only token ids cross to the host; the others by
// their host Sampler over the logits row. A step holding both kinds copies the logits to the host
// and applies the rule there (sampling/host_rule.h). Every path draws by the one rule of
// sampling/sampling_rule.h with the noise of (seed, step, token), so a sequence's tokens depend
// only on its prompt, parameters and seed: not on logprobs, streaming, n, the batch it lands in or
// where it is sampled.
//
// Encoder-decoder models (built on a Seq2SeqRunner): a request's prompt is its encoder's input and
// its sequence's tokens are the decoder's, from spec.decoder_start_token_id (engine/sequence.h).
// A step whose plan starts some decoders at position 0 first runs their encoders in one batch
// (Seq2SeqRunner::encode, writing the cross K/V into their blocks); the decoder steps of all
// running requests share the forward as any others do. Penalties see the start token as the
// prompt, as seq2seq/seq2seq_generator.h's do. No prefix caching, resumption or KV import.
#pragma once

#include "engine/constrained_step.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/stop_checker.h"
#include "runtime/model_runner.h"
#include "sampling/host_rule.h"
#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace splitflow {

class Seq2SeqRunner;

// One sampled token.
struct TokenOutput {
  int32_t token_id = -1;
  float logprob = 0.0f;                    // the model's log-probability (NaN unless params.logprobs)
  std::vector<TokenLogprob> top_logprobs;  // params.top_logprobs most probable, most probable first
};

// What one sequence produced in one step: exactly one sampled token.
struct SequenceOutput {
  int64_t request_id = 0;
  int32_t index = 0;  // which of the request's n choices
  TokenOutput token;
  // Text that became safe to send (complete UTF-8, not possibly the start of a stop string).
  // At the finish it holds everything left; a matched stop string is never part of it.
  std::string text;
  FinishReason finish_reason = FinishReason::None;  // set on the sequence's last output
  int32_t num_cached_prompt_tokens = 0;             // prompt tokens the prefix cache supplied
};

struct EngineStep {
  std::vector<SequenceOutput> outputs;  // in span order of the batch
  int32_t num_prefill_tokens = 0;       // prompt chunks and recomputed tokens run this step
  int32_t num_decode_tokens = 0;
  int32_t num_encoder_tokens = 0;       // encoder inputs run before the forward (encoder-decoders)
  int32_t num_preempted = 0;            // sequences preempted while planning it (recompute or swap)
  int32_t num_swapped_out = 0;          // of those, swapped to host memory
  int32_t num_swapped_in = 0;           // sequences readmitted from host memory
  std::vector<int64_t> finished_requests;  // requests whose every choice finished this step
};

struct EngineOptions {
  // Sample on the device when the parameters allow (see above); false: always the host Sampler.
  bool device_sampling = true;
  // Steps in flight at once, for a runner that leads pipeline stages (parallel/local_pipeline.h,
  // multi-process pipeline jobs): up to this many plans are submitted (ModelRunner::submit_sample)
  // before the oldest one's tokens are collected, so each stage works on a micro-batch of its own
  // (reference 000's pipeline with SplitFuse). Consecutive plans hold disjoint sequences
  // (Sequence::in_flight). A plan needing the host (logits for the host sampler, structured
  // outputs, an encoder) first waits for the steps in flight and runs alone. 1: one step at a time.
  int32_t max_steps_in_flight = 1;
};

// How a request starts (Splitwise and failover; splitwise/, router/). Default: a fresh request.
struct RequestStart {
  // Tokens the request already generated elsewhere (a request resumed after its instance failed):
  // they follow the prompt, count towards max_tokens, continue the seeded draws at their step
  // (step = tokens generated so far), go through the stop checker and the detokenizer without
  // being sent again, and their KV is recomputed (or imported) with the prompt's. n must be 1.
  std::vector<int32_t> prior_output_ids;
  // The KV of every token but the last comes from another instance (a Splitwise prompt instance):
  // the request first waits for blocks (take_kv_reservations), then runs once admit_imported() says
  // the KV is written; its first step computes only the last token. n must be 1.
  bool import_kv = false;
};

// Blocks reserved for a request whose KV another instance computes (RequestStart::import_kv).
struct KvReservation {
  int64_t request_id = 0;
  std::vector<int32_t> token_ids;    // the tokens whose KV must arrive: all of the request's but the last
  std::vector<int32_t> block_table;  // position p goes to block block_table[p / block_size], slot p % block_size
  int32_t num_cached_tokens = 0;     // positions [0, this) already hold this KV (prefix cache): never write them
};

// One span of a step as a KV observer sees it.
struct KvStepSpan {
  int64_t request_id = 0;
  int32_t start_position = 0;
  int32_t num_tokens = 0;
  int32_t num_prompt_tokens = 0;     // the prompt computed when start_position + num_tokens reaches it
  std::vector<int32_t> block_table;  // covers [0, start_position + num_tokens)
};

// Watches the KV a step writes (Splitwise prompt instances export it, splitwise/kv_export.h). Called on
// the engine's thread: step_begin() with the step's spans before its forward, layer_done(l) as each
// layer's KV is written (ModelRunner::set_layer_listener), step_end() after the forward, before the
// blocks of sequences finished by the step are released. It must not block on the network.
class KvStepObserver {
 public:
  virtual ~KvStepObserver() = default;
  virtual void step_begin(std::span<const KvStepSpan> spans) = 0;
  virtual void layer_done(int32_t layer) = 0;
  virtual void step_end() = 0;
};

// Whether the device's sampling rule (sampling/sampling_rule.h) covers these parameters.
bool device_samplable(const SamplingParams& params);

class Engine {
 public:
  // config.eos_token_ids is filled from the tokenizer (or the spec without one) when empty.
  // config.max_batch_tokens / max_seqs must not exceed the runner's limits, and num_blocks /
  // block_size / num_host_blocks must be the runner's KV cache and swap area. tokenizer may be null: ids in, ids out, no text.
  Engine(ModelRunner& runner, const Tokenizer* tokenizer, SchedulerConfig config, EngineOptions options = {});
  // An encoder-decoder model: the decoder is runner.decoder(), whose limits and cache the config
  // must match as above.
  Engine(Seq2SeqRunner& runner, const Tokenizer* tokenizer, SchedulerConfig config, EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Throws splitflow::Error naming the problem: bad params, n < 1, an empty prompt, a token
  // outside the vocabulary, a prompt longer than max_prompt_tokens(). Touches no engine state, so any
  // thread may call it while another runs step().
  void check_request(std::span<const int32_t> prompt_ids, const SamplingParams& params, int32_t n) const;
  // Queues a request after check_request(); returns its id (increasing from 0).
  int64_t add_request(std::vector<int32_t> prompt_ids, const SamplingParams& params, int32_t n = 1);
  // The same, started as `start` says (resumed, or its KV imported).
  int64_t add_request(std::vector<int32_t> prompt_ids, const SamplingParams& params, int32_t n, RequestStart start);
  // Reserves blocks for queued import_kv requests, oldest first, while the free blocks allow, and
  // returns those reserved now: the caller writes their KV, then calls admit_imported() (or abort()).
  std::vector<KvReservation> take_kv_reservations();
  // The request's imported KV arrived: `write_kv` (may be empty) puts it into the reserved blocks,
  // then the request runs from the next step. False, writing nothing, for an unknown (aborted)
  // request or one without a reservation; a write that throws aborts the request and rethrows.
  bool admit_imported(int64_t request_id, const std::function<void()>& write_kv = {});
  // Sees every step's KV from now on (null: none). Sets the runner's layer listener.
  void set_kv_observer(KvStepObserver* observer);
  // Encodes the text with the tokenizer's special tokens (BOS); throws without a tokenizer.
  int64_t add_request(std::string_view prompt, const SamplingParams& params, int32_t n = 1);
  // Ends every sequence of the request at once ("abort") and releases its KV blocks; no more
  // output comes for it. Returns false for an unknown or already finished request.
  bool abort(int64_t request_id);

  // One forward over the scheduled batch; an empty step when nothing is pending.
  EngineStep step();
  // ModelRunner::warm_up() for the steps this engine issues (with device sampling, the sampled
  // decode recordings too). Call before the first request: no sequence or cache state changes.
  WarmupReport warm_up();

  // Requests not finished, or finished in steps whose outputs step() has not returned yet.
  bool has_unfinished() const { return !requests_.empty() || !ready_.empty(); }
  // Whether step() has anything to run (requests waiting for imported KV do not count).
  bool has_work() const { return scheduler_.has_unfinished() || !in_flight_.empty() || !ready_.empty(); }
  int32_t num_importing_requests() const { return static_cast<int32_t>(importing_.size()); }
  int32_t num_unfinished_requests() const { return static_cast<int32_t>(requests_.size()); }
  // Sequences the scheduler holds, plus the later choices of n > 1 requests not queued yet and
  // KV-importing requests still waiting for blocks.
  int32_t num_waiting_sequences() const;
  int32_t num_running_sequences() const { return static_cast<int32_t>(scheduler_.running().size()); }
  int32_t num_swapped_sequences() const { return static_cast<int32_t>(scheduler_.swapped().size()); }
  // Steps submitted whose tokens have not been collected (EngineOptions::max_steps_in_flight).
  int32_t num_steps_in_flight() const { return static_cast<int32_t>(in_flight_.size()); }
  const Scheduler& scheduler() const { return scheduler_; }
  const SchedulerConfig& config() const { return scheduler_.config(); }
  const ModelRunner& runner() const { return runner_; }
  bool encoder_decoder() const { return seq2seq_ != nullptr; }
  // The longest prompt a request may have: max_model_len, or an encoder-decoder's encoder input
  // (its encoder's context, less than one step's tokens, at most the whole cache).
  int32_t max_prompt_tokens() const;
  const Tokenizer* tokenizer() const { return tokenizer_; }
  // Structured outputs' host time so far: the masks' helper and the steps' wait for it.
  ConstrainedStepStats constrained_step_stats() const { return constrained_->stats(); }

 private:
  struct SequenceState;
  struct Request;

  Engine(ModelRunner& runner, Seq2SeqRunner* seq2seq, const Tokenizer* tokenizer, SchedulerConfig config,
         EngineOptions options);
  // Runs the encoders of the plan's sequences whose decoder starts this step.
  void encode_new_sequences(const StepPlan& plan);
  void finish_output(SequenceState& state, SequenceOutput& output);
  void add_later_choices(Request& request);
  // A token generated elsewhere (RequestStart::prior_output_ids), fed through the stop checker,
  // detokenizer and constraint as if sampled here, its text counted as sent.
  void replay_token(SequenceState& state, int32_t token);
  std::vector<KvStepSpan> kv_step_spans(const StepPlan& plan) const;
  // One token per sampled sequence of the plan (in logits row order), outputs filled.
  void forward_and_sample(const StepPlan& plan, const std::vector<SequenceState*>& sampled,
                          std::vector<SequenceOutput>& outputs);
  // The plan's sampled sequences, in logits row order.
  std::vector<SequenceState*> sampled_states(const StepPlan& plan) const;
  // After the forward: the tokens (in result.outputs) appended, stop checks, text, finishes.
  EngineStep finish_step(const StepPlan& plan, const std::vector<SequenceState*>& sampled, EngineStep result);
  // step() with several steps in flight (EngineOptions::max_steps_in_flight).
  EngineStep step_pipelined();
  // The oldest step in flight, collected and finished.
  EngineStep collect_oldest();
  // Every step in flight collected and finished, into ready_ (before a step that must run alone,
  // or an abort of a request in flight).
  void drain_in_flight();

  struct InFlightStep {
    StepPlan plan;
    std::vector<SequenceState*> sampled;
    EngineStep result;  // its counts, and outputs waiting for their tokens
    std::function<std::vector<int32_t>()> collect;
  };
  std::deque<InFlightStep> in_flight_;
  std::deque<EngineStep> ready_;  // finished ahead of their turn: step() returns these first

  ModelRunner& runner_;           // the decoder of an encoder-decoder
  Seq2SeqRunner* seq2seq_;        // an encoder-decoder's runners; null for other models
  const Tokenizer* tokenizer_;
  EngineOptions options_;
  RuleScratch rule_scratch_;  // the rule on the host, for device-sampled rows of mixed steps
  Scheduler scheduler_;
  int64_t next_request_id_ = 0;
  int64_t next_sequence_id_ = 0;
  std::unordered_map<int64_t, std::unique_ptr<Request>> requests_;
  // Structured outputs: the masks of each step's constrained rows, on one helper thread.
  std::unique_ptr<ConstrainedStep> constrained_ = std::make_unique<ConstrainedStep>();
  std::unordered_map<int64_t, SequenceState*> sequences_;  // by Sequence::id, while unfinished
  int32_t num_deferred_sequences_ = 0;                      // later choices not queued yet
  std::vector<SequenceState*> importing_;  // import_kv requests: waiting for blocks, or reserved until admitted
  KvStepObserver* kv_observer_ = nullptr;
};

}  // namespace splitflow
