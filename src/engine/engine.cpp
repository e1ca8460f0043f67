#include "engine/engine.h"

#include "core/error.h"
#include "engine/constrained_step.h"
#include "seq2seq/seq2seq_runner.h"

#include <algorithm>
#include <limits>
#include <random>
#include <utility>

namespace splitflow {

bool device_samplable(const SamplingParams& p) {
  return !p.logprobs && p.top_logprobs == 0 && p.repetition_penalty == 1.0f && p.frequency_penalty == 0.0f &&
         p.presence_penalty == 0.0f && p.fsd == FsdMode::Off && p.mirostat == 0 && p.typical_p == 1.0f &&
         p.tfs_z == 1.0f;
}

struct Engine::SequenceState {
  SequenceState(int64_t seq_id, std::vector<int32_t> prompt_ids, const SamplingParams& params, int32_t vocab_size,
                std::span<const int32_t> eos_token_ids, const Tokenizer* tokenizer, Request& request, int32_t index,
                bool device_sampled)
      : seq(seq_id, std::move(prompt_ids), params),
        sampler(params, vocab_size),
        device_sampled(device_sampled),
        stop(params, eos_token_ids),
        request(request),
        index(index) {
    if (params.constraint) constraint = params.constraint->start();
    if (tokenizer) decoder.emplace(*tokenizer, /*skip_special=*/true);
  }

  // The device rule's parameters for the next token.
  SamplingRow sampling_row() const {
    const SamplingParams& p = seq.params;
    SamplingRow row;
    row.temperature = p.temperature;
    row.top_k = p.top_k;
    row.top_p = p.top_p;
    row.min_p = p.min_p;
    row.seed = *p.seed;  // set by add_request
    row.step = static_cast<uint64_t>(seq.num_output_tokens());
    return row;
  }

  Sequence seq;
  Sampler sampler;  // used unless device_sampled
  bool device_sampled;
  StopChecker stop;
  std::optional<StreamDecoder> decoder;
  size_t sent_bytes = 0;  // of stop.text(), already returned in outputs
  std::unique_ptr<TokenConstraint> constraint;  // structured outputs: the tokens allowed next
  // The token drawn last, not yet accepted by `constraint`: the next step's mask computation
  // accepts it first, on its helper thread (engine/constrained_step.h).
  std::optional<int32_t> constraint_pending;
  Request& request;
  int32_t index;
};

struct Engine::Request {
  int64_t id = 0;
  std::vector<std::unique_ptr<SequenceState>> seqs;  // (n) by choice index
  int32_t num_unfinished = 0;
  bool later_choices_queued = false;
};

Engine::Engine(ModelRunner& runner, const Tokenizer* tokenizer, SchedulerConfig config, EngineOptions options)
    : Engine(runner, nullptr, tokenizer, std::move(config), options) {}

Engine::Engine(Seq2SeqRunner& runner, const Tokenizer* tokenizer, SchedulerConfig config, EngineOptions options)
    : Engine(runner.decoder(), &runner, tokenizer, std::move(config), options) {}

Engine::Engine(ModelRunner& runner, Seq2SeqRunner* seq2seq, const Tokenizer* tokenizer, SchedulerConfig config,
               EngineOptions options)
    : runner_(runner),
      seq2seq_(seq2seq),
      tokenizer_(tokenizer),
      options_(options),
      scheduler_([&] {
        if (config.eos_token_ids.empty()) {
          if (tokenizer) {
            config.eos_token_ids = tokenizer->eos_ids();
          } else {
            config.eos_token_ids.assign(runner.spec().eos_token_ids.begin(), runner.spec().eos_token_ids.end());
          }
        }
        return std::move(config);
      }()) {
  scheduler_.set_micro_batches(options.max_steps_in_flight);
  SF_CHECK(!runner.encoder_decoder() || seq2seq != nullptr,
           "engine: {} is an encoder_decoder model: the engine needs its encoder too (a Seq2SeqRunner; splitflow "
           "generate and serve run such models)",
           runner.spec().name.empty() ? "the model" : runner.spec().name);
  const SchedulerConfig& c = scheduler_.config();
  SF_CHECK(c.max_batch_tokens <= runner.limits().max_batch_tokens,
           "engine: max_batch_tokens {} exceeds the model runner's {}", c.max_batch_tokens,
           runner.limits().max_batch_tokens);
  SF_CHECK(c.max_seqs <= runner.limits().max_seqs, "engine: max_seqs {} exceeds the model runner's {}", c.max_seqs,
           runner.limits().max_seqs);
  SF_CHECK(c.num_blocks == runner.kv_config().num_blocks && c.block_size == runner.kv_config().block_size,
           "engine: the scheduler's KV cache ({} blocks of {} tokens) is not the runner's ({} blocks of {})",
           c.num_blocks, c.block_size, runner.kv_config().num_blocks, runner.kv_config().block_size);
  SF_CHECK(c.num_host_blocks == runner.kv_config().num_host_blocks,
           "engine: the scheduler's swap space ({} host blocks) is not the runner's ({} host blocks)", c.num_host_blocks,
           runner.kv_config().num_host_blocks);
  SF_CHECK(c.max_model_len <= runner.context_limit(), "engine: max_model_len {} exceeds the model's context {}",
           c.max_model_len, runner.context_limit());
}

Engine::~Engine() = default;

WarmupReport Engine::warm_up() { return runner_.warm_up(options_.device_sampling); }

int32_t Engine::max_prompt_tokens() const {
  if (!seq2seq_) return config().max_model_len;
  const int64_t cache_tokens = int64_t{config().num_blocks} * config().block_size;
  return static_cast<int32_t>(
      std::min<int64_t>({seq2seq_->max_prompt_tokens(), config().max_batch_tokens - 1, cache_tokens}));
}

void Engine::check_request(std::span<const int32_t> prompt_ids, const SamplingParams& params, int32_t n) const {
  const int32_t vocab_size = runner_.spec().vocab_size;
  params.validate();
  params.validate_token_ids(vocab_size);
  SF_CHECK(n >= 1, "n (choices per request) must be >= 1, got {}", n);
  SF_CHECK(!prompt_ids.empty(), "the prompt is empty: give some text (or token ids) to continue");
  for (size_t i = 0; i < prompt_ids.size(); ++i) {
    SF_CHECK(prompt_ids[i] >= 0 && prompt_ids[i] < vocab_size,
             "prompt token {} at index {} is outside the vocabulary [0, {})", prompt_ids[i], i, vocab_size);
  }
  if (seq2seq_) {
    SF_CHECK(static_cast<int64_t>(prompt_ids.size()) <= max_prompt_tokens(),
             "the prompt has {} tokens but the encoder takes at most {} (its context, one step's tokens less the "
             "decoder's first, the KV cache)", prompt_ids.size(), max_prompt_tokens());
    return;
  }
  SF_CHECK(static_cast<int64_t>(prompt_ids.size()) <= config().max_model_len,
           "the prompt has {} tokens but the model's context holds {}", prompt_ids.size(), config().max_model_len);
}

int64_t Engine::add_request(std::vector<int32_t> prompt_ids, const SamplingParams& params, int32_t n) {
  return add_request(std::move(prompt_ids), params, n, RequestStart{});
}

int64_t Engine::add_request(std::vector<int32_t> prompt_ids, const SamplingParams& params, int32_t n,
                            RequestStart start) {
  check_request(prompt_ids, params, n);
  const std::vector<int32_t>& prior = start.prior_output_ids;
  SF_CHECK(!seq2seq_ || (prior.empty() && !start.import_kv),
           "an encoder_decoder model's requests cannot be resumed or import their KV");
  if (!prior.empty() || start.import_kv) {
    SF_CHECK(n == 1, "a resumed or KV-importing request has one choice, not n = {}", n);
    for (size_t i = 0; i < prior.size(); ++i) {
      SF_CHECK(prior[i] >= 0 && prior[i] < runner_.spec().vocab_size,
               "generated token {} at index {} is outside the vocabulary [0, {})", prior[i], i,
               runner_.spec().vocab_size);
    }
    SF_CHECK(static_cast<int64_t>(prior.size()) < params.max_tokens,
             "the request already generated {} tokens, its max_tokens is {}: nothing is left to generate",
             prior.size(), params.max_tokens);
    SF_CHECK(static_cast<int64_t>(prompt_ids.size() + prior.size()) <= config().max_model_len,
             "the prompt ({} tokens) and the tokens already generated ({}) exceed the model's context of {}",
             prompt_ids.size(), prior.size(), config().max_model_len);
  }
  auto request = std::make_unique<Request>();
  request->id = next_request_id_++;
  // The request's seed, drawn once when unset (engine.h).
  const uint64_t seed = params.seed ? *params.seed : (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  for (int32_t i = 0; i < n; ++i) {
    SamplingParams choice_params = params;
    choice_params.seed = seed + static_cast<uint64_t>(i);
    // An encoder-decoder's sequence: the decoder's tokens, the prompt for its encoder.
    std::vector<int32_t> decoder_prompt =
        seq2seq_ ? std::vector<int32_t>{runner_.spec().decoder_start_token_id} : prompt_ids;
    request->seqs.push_back(std::make_unique<SequenceState>(next_sequence_id_++, std::move(decoder_prompt),
                                                            choice_params, runner_.spec().vocab_size,
                                                            config().eos_token_ids, tokenizer_, *request, i,
                                                            options_.device_sampling && device_samplable(params)));
    if (seq2seq_) request->seqs.back()->seq.encoder_token_ids = prompt_ids;
    sequences_.emplace(request->seqs.back()->seq.id, request->seqs.back().get());
  }
  request->num_unfinished = n;
  request->later_choices_queued = n == 1;
  num_deferred_sequences_ += n - 1;
  SequenceState& first = *request->seqs.front();
  for (const int32_t token : prior) replay_token(first, token);
  if (start.import_kv) {
    importing_.push_back(&first);
  } else {
    scheduler_.add(first.seq);
  }
  const int64_t id = request->id;
  requests_.emplace(id, std::move(request));
  return id;
}

void Engine::replay_token(SequenceState& state, int32_t token) {
  state.seq.token_ids.push_back(token);
  const auto& eos = config().eos_token_ids;
  if (state.constraint && std::find(eos.begin(), eos.end(), token) == eos.end()) state.constraint->accept_token(token);
  state.stop.append(token, state.decoder ? state.decoder->push(token) : std::string());
  SF_CHECK(!state.stop.finished(), "the tokens already generated end the request ({}): nothing is left to generate",
           finish_reason_name(state.stop.finish_reason()));
  state.sent_bytes = state.stop.safe_bytes();  // their text was sent by the instance that generated them
}

std::vector<KvReservation> Engine::take_kv_reservations() {
  std::vector<KvReservation> reserved;
  for (SequenceState* state : importing_) {
    Sequence& seq = state->seq;
    if (seq.status == SequenceStatus::Reserved) continue;
    if (!scheduler_.reserve(seq)) break;  // oldest first: no request overtakes another
    KvReservation reservation;
    reservation.request_id = state->request.id;
    reservation.token_ids.assign(seq.token_ids.begin(), seq.token_ids.end() - 1);
    reservation.block_table = seq.block_table;
    reservation.num_cached_tokens = seq.num_computed_tokens;
    reserved.push_back(std::move(reservation));
  }
  return reserved;
}

bool Engine::admit_imported(int64_t request_id, const std::function<void()>& write_kv) {
  const auto it = requests_.find(request_id);
  if (it == requests_.end()) return false;
  SequenceState* state = it->second->seqs.front().get();
  const auto at = std::find(importing_.begin(), importing_.end(), state);
  if (at == importing_.end() || state->seq.status != SequenceStatus::Reserved) return false;
  if (write_kv) {
    try {
      write_kv();
    } catch (...) {
      abort(request_id);
      throw;
    }
  }
  importing_.erase(at);
  scheduler_.admit_reserved(state->seq);
  return true;
}

void Engine::set_kv_observer(KvStepObserver* observer) {
  SF_CHECK(observer == nullptr || options_.max_steps_in_flight == 1,
           "engine: a KV observer (Splitwise roles) needs one step at a time, not {} in flight", options_.max_steps_in_flight);
  SF_CHECK(!seq2seq_ || observer == nullptr, "an encoder_decoder model's KV is not exported");
  kv_observer_ = observer;
  if (observer) {
    runner_.set_layer_listener([observer](int32_t layer) { observer->layer_done(layer); });
  } else {
    runner_.set_layer_listener(nullptr);
  }
}

std::vector<KvStepSpan> Engine::kv_step_spans(const StepPlan& plan) const {
  std::vector<KvStepSpan> spans;
  for (size_t s = 0; s < plan.seqs.size(); ++s) {
    const SequenceSpan& span = plan.batch.spans[s];
    spans.push_back({sequences_.at(plan.seqs[s]->id)->request.id, span.start_position, span.num_tokens,
                     plan.seqs[s]->num_prompt_tokens, span.block_table});
  }
  return spans;
}

int64_t Engine::add_request(std::string_view prompt, const SamplingParams& params, int32_t n) {
  SF_CHECK(tokenizer_ != nullptr, "this model has no tokenizer: give the prompt as token ids");
  return add_request(tokenizer_->encode(prompt, /*add_special=*/true), params, n);
}

void Engine::add_later_choices(Request& request) {
  // Pushed to the front in reverse, so they run in choice order ahead of later requests.
  for (size_t i = request.seqs.size(); i-- > 1;) scheduler_.add(request.seqs[i]->seq, /*at_front=*/true);
  num_deferred_sequences_ -= static_cast<int32_t>(request.seqs.size()) - 1;
  request.later_choices_queued = true;
}

bool Engine::abort(int64_t request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return false;
  // A step in flight still writes this request's KV and holds its sequences: let it finish first,
  // and drop what it produced for the request (no output comes after an abort).
  if (std::any_of(it->second->seqs.begin(), it->second->seqs.end(),
                  [](const auto& state) { return state->seq.in_flight; })) {
    drain_in_flight();
    for (EngineStep& step : ready_) {
      std::erase_if(step.outputs, [&](const SequenceOutput& output) { return output.request_id == request_id; });
      std::erase(step.finished_requests, request_id);
    }
    it = requests_.find(request_id);
    if (it == requests_.end()) return true;  // it finished in the step that was in flight
  }
  Request& request = *it->second;
  for (const auto& state : request.seqs) {
    if (state->seq.is_finished()) continue;
    const bool queued = state->index == 0 || request.later_choices_queued;
    if (queued) scheduler_.finish(state->seq, FinishReason::Abort);
    std::erase(importing_, state.get());
    sequences_.erase(state->seq.id);
  }
  if (!request.later_choices_queued) num_deferred_sequences_ -= static_cast<int32_t>(request.seqs.size()) - 1;
  requests_.erase(it);
  return true;
}

int32_t Engine::num_waiting_sequences() const {
  const auto unreserved = std::count_if(importing_.begin(), importing_.end(), [](const SequenceState* state) {
    return state->seq.status == SequenceStatus::Waiting;
  });
  return static_cast<int32_t>(scheduler_.waiting().size() + unreserved) + num_deferred_sequences_;
}

void Engine::finish_output(SequenceState& state, SequenceOutput& output) {
  Sequence& seq = state.seq;
  // The scheduler ends a sequence on EOS / stop tokens and max_tokens exactly as the StopChecker
  // does, and on a full context, which only it sees; a stop string only the StopChecker sees.
  if (seq.is_finished()) {
    state.stop.finish(seq.finish_reason);
  } else if (state.stop.finished()) {
    scheduler_.finish(seq, state.stop.finish_reason());
  }
  if (state.stop.finished()) {
    if (state.decoder) state.stop.append_final_text(state.decoder->finish());
    seq.finish_reason = state.stop.finish_reason();
    output.finish_reason = seq.finish_reason;
  }
  const size_t safe = state.stop.safe_bytes();
  output.text = state.stop.text().substr(state.sent_bytes, safe - state.sent_bytes);
  state.sent_bytes = safe;
  output.num_cached_prompt_tokens = std::min(seq.num_cached_tokens, seq.num_prompt_tokens);
}

void Engine::encode_new_sequences(const StepPlan& plan) {
  ForwardBatch prompts;
  for (size_t s = 0; s < plan.seqs.size(); ++s) {
    const Sequence& seq = *plan.seqs[s];
    const SequenceSpan& span = plan.batch.spans[s];
    if (span.start_position != 0 || seq.encoder_token_ids.empty()) continue;
    prompts.token_ids.insert(prompts.token_ids.end(), seq.encoder_token_ids.begin(), seq.encoder_token_ids.end());
    prompts.spans.push_back({seq.num_encoder_tokens(), 0, span.block_table, false});
  }
  seq2seq_->encode(prompts);
}

void Engine::forward_and_sample(const StepPlan& plan, const std::vector<SequenceState*>& sampled,
                                std::vector<SequenceOutput>& outputs) {
  outputs.resize(sampled.size());
  for (size_t i = 0; i < sampled.size(); ++i) {
    outputs[i].request_id = sampled[i]->request.id;
    outputs[i].index = sampled[i]->index;
    outputs[i].token.logprob = std::numeric_limits<float>::quiet_NaN();
  }
  const bool all_device =
      !sampled.empty() && std::all_of(sampled.begin(), sampled.end(), [](const SequenceState* s) { return s->device_sampled; });
  // Structured outputs: the constrained rows' masks, computed on a helper thread while the forward runs.
  const int64_t vocab = runner_.spec().vocab_size;
  ConstrainedStep& constrained = *constrained_;
  std::vector<TokenConstraint*> constraints;
  std::vector<std::optional<int32_t>> accept_first;
  for (SequenceState* state : sampled) {
    constraints.push_back(state->constraint.get());
    accept_first.push_back(std::exchange(state->constraint_pending, std::nullopt));
  }
  constrained.start(std::move(constraints), static_cast<int32_t>(vocab), config().eos_token_ids, std::move(accept_first));
  struct Settle {
    ConstrainedStep& step;
    ~Settle() { step.settle(); }
  } settle{constrained};
  if (all_device) {
    std::vector<SamplingRow> rows;
    for (const SequenceState* state : sampled) rows.push_back(state->sampling_row());
    const std::vector<int32_t> tokens =
        constrained.any() ? runner_.forward_sample(plan.batch, rows, [&] { return constrained.all_masks(); })
                          : runner_.forward_sample(plan.batch, rows);
    for (size_t i = 0; i < sampled.size(); ++i) outputs[i].token.token_id = tokens[i];
    return;
  }
  const Tensor logits = runner_.forward(plan.batch);
  for (size_t i = 0; i < sampled.size(); ++i) {
    SequenceState& state = *sampled[i];
    float* row = const_cast<float*>(logits.as<float>()) + static_cast<int64_t>(i) * vocab;
    TokenOutput& token = outputs[i].token;
    constrained.apply(i, std::span<float>(row, static_cast<size_t>(vocab)));
    if (state.device_sampled) {
      token.token_id = sample_by_rule(std::span<const float>(row, static_cast<size_t>(vocab)), state.sampling_row(),
                                      rule_scratch_);
      continue;
    }
    const TokenLogprob sampled_token = state.sampler.sample(std::span<const float>(row, static_cast<size_t>(vocab)),
                                                            state.seq.prompt_ids(), state.seq.output_ids());
    token.token_id = sampled_token.token_id;
    token.logprob = sampled_token.logprob;
    const auto top = state.sampler.top_logprobs();
    token.top_logprobs.assign(top.begin(), top.end());
  }
}

std::vector<Engine::SequenceState*> Engine::sampled_states(const StepPlan& plan) const {
  std::vector<SequenceState*> sampled;  // in logits row order
  for (size_t s = 0; s < plan.seqs.size(); ++s) {
    if (plan.batch.spans[s].want_logits) sampled.push_back(sequences_.at(plan.seqs[s]->id));
  }
  return sampled;
}

EngineStep Engine::step() {
  if (!ready_.empty()) {
    EngineStep result = std::move(ready_.front());
    ready_.pop_front();
    return result;
  }
  if (options_.max_steps_in_flight > 1) return step_pipelined();
  EngineStep result;
  const StepPlan plan = scheduler_.schedule();
  // In this order (scheduler.h): a swap-out may reuse a host block a swap-in frees, and the
  // forward may write a device block a swap-out frees.
  runner_.swap_blocks(plan.swap_in_copies, CopyDirection::HostToDevice);
  runner_.swap_blocks(plan.swap_out_copies, CopyDirection::DeviceToHost);
  result.num_swapped_out = static_cast<int32_t>(plan.swapped_out.size());
  result.num_swapped_in = static_cast<int32_t>(plan.swapped_in.size());
  result.num_preempted = static_cast<int32_t>(plan.preempted.size()) + result.num_swapped_out;
  if (plan.empty()) return result;
  result.num_prefill_tokens = plan.num_prefill_tokens;
  result.num_decode_tokens = plan.num_decode_tokens;
  result.num_encoder_tokens = plan.num_encoder_tokens;
  if (plan.num_encoder_tokens > 0) encode_new_sequences(plan);

  const std::vector<SequenceState*> sampled = sampled_states(plan);
  if (kv_observer_) kv_observer_->step_begin(kv_step_spans(plan));
  forward_and_sample(plan, sampled, result.outputs);
  if (kv_observer_) kv_observer_->step_end();
  return finish_step(plan, sampled, std::move(result));
}

EngineStep Engine::finish_step(const StepPlan& plan, const std::vector<SequenceState*>& sampled, EngineStep result) {
  std::vector<int32_t> tokens;
  for (const SequenceOutput& output : result.outputs) tokens.push_back(output.token.token_id);
  scheduler_.postprocess(plan, tokens);

  for (size_t i = 0; i < sampled.size(); ++i) {
    SequenceState& state = *sampled[i];
    SequenceOutput& output = result.outputs[i];
    const int32_t token = output.token.token_id;
    if (state.constraint && std::find(config().eos_token_ids.begin(), config().eos_token_ids.end(), token) ==
                                config().eos_token_ids.end()) {
      state.constraint_pending = token;  // accepted by the next step's mask computation
    }
    state.stop.append(token, state.decoder ? state.decoder->push(token) : std::string());
    finish_output(state, output);
    Request& request = state.request;
    if (!request.later_choices_queued) add_later_choices(request);
    if (output.finish_reason != FinishReason::None) {
      sequences_.erase(state.seq.id);
      if (--request.num_unfinished == 0) result.finished_requests.push_back(request.id);
    }
  }
  for (const int64_t id : result.finished_requests) requests_.erase(id);
  return result;
}

EngineStep Engine::step_pipelined() {
  SF_CHECK(kv_observer_ == nullptr, "engine: a KV observer (Splitwise) needs one step at a time, not {} in flight",
           options_.max_steps_in_flight);
  EngineStep planning;  // what a schedule() without a plan did (preemptions, swaps): counted in the step returned
  while (static_cast<int32_t>(in_flight_.size()) < options_.max_steps_in_flight) {
    StepPlan plan = scheduler_.schedule();
    runner_.swap_blocks(plan.swap_in_copies, CopyDirection::HostToDevice);
    runner_.swap_blocks(plan.swap_out_copies, CopyDirection::DeviceToHost);
    EngineStep result;
    result.num_swapped_out = static_cast<int32_t>(plan.swapped_out.size());
    result.num_swapped_in = static_cast<int32_t>(plan.swapped_in.size());
    result.num_preempted = static_cast<int32_t>(plan.preempted.size()) + result.num_swapped_out;
    if (plan.empty()) {
      planning.num_swapped_out += result.num_swapped_out;
      planning.num_swapped_in += result.num_swapped_in;
      planning.num_preempted += result.num_preempted;
      break;
    }
    result.num_prefill_tokens = plan.num_prefill_tokens;
    result.num_decode_tokens = plan.num_decode_tokens;
    result.num_encoder_tokens = plan.num_encoder_tokens;
    std::vector<SequenceState*> sampled = sampled_states(plan);
    const bool alone = plan.num_encoder_tokens > 0 ||
                       std::any_of(sampled.begin(), sampled.end(), [](const SequenceState* state) {
                         return !state->device_sampled || state->constraint != nullptr;
                       });
    if (alone) {  // the host needs this step's logits: the steps before it finish first
      drain_in_flight();
      if (plan.num_encoder_tokens > 0) encode_new_sequences(plan);
      forward_and_sample(plan, sampled, result.outputs);
      ready_.push_back(finish_step(plan, sampled, std::move(result)));
      break;
    }
    std::vector<SamplingRow> rows;
    result.outputs.resize(sampled.size());
    for (size_t i = 0; i < sampled.size(); ++i) {
      rows.push_back(sampled[i]->sampling_row());
      result.outputs[i].request_id = sampled[i]->request.id;
      result.outputs[i].index = sampled[i]->index;
      result.outputs[i].token.logprob = std::numeric_limits<float>::quiet_NaN();
    }
    for (Sequence* seq : plan.seqs) seq->in_flight = true;
    std::function<std::vector<int32_t>()> collect = runner_.submit_sample(plan.batch, rows);
    in_flight_.push_back({std::move(plan), std::move(sampled), std::move(result), std::move(collect)});
  }
  if (!in_flight_.empty() && ready_.empty()) ready_.push_back(collect_oldest());
  if (ready_.empty()) return planning;
  EngineStep result = std::move(ready_.front());
  ready_.pop_front();
  result.num_swapped_out += planning.num_swapped_out;
  result.num_swapped_in += planning.num_swapped_in;
  result.num_preempted += planning.num_preempted;
  return result;
}

EngineStep Engine::collect_oldest() {
  InFlightStep step = std::move(in_flight_.front());
  in_flight_.pop_front();
  const std::vector<int32_t> tokens = step.collect();
  SF_CHECK(tokens.size() == step.sampled.size(), "engine: a step in flight returned {} tokens for {} sampled rows",
           tokens.size(), step.sampled.size());
  for (size_t i = 0; i < tokens.size(); ++i) step.result.outputs[i].token.token_id = tokens[i];
  return finish_step(step.plan, step.sampled, std::move(step.result));
}

void Engine::drain_in_flight() {
  while (!in_flight_.empty()) ready_.push_back(collect_oldest());
}

}  // namespace splitflow
