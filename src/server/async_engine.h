// server/async_engine.h — runs the Engine on its own thread for many client threads. Clients
// submit() a tokenized request (or submit_group() the prompts of one multi-prompt request, admitted
// together) and read its RequestStream(s); the loop hands each step's outputs to
// the streams (a mutex and a condition variable per stream), cancels requests whose client went
// away (their KV blocks are freed at once), records latency and throughput in ServingMetrics and
// drains gracefully on shutdown. Only the loop thread touches the Engine.
//
// Backpressure: the loop never waits for a client. A slow reader's deltas merge in its stream
// (text appended, tokens appended), so memory grows with its output, not with the number of steps;
// admission is bounded instead: a request that would take the number of waiting sequences past
// max_queued_sequences is refused (SubmitRejected::QueueFull, HTTP 429) unless nothing waits.
#pragma once

#include "core/error.h"
#include "engine/engine.h"
#include "server/metrics.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace splitflow {

// What one choice produced since the previous RequestStream::next().
struct ChoiceDelta {
  std::string text;
  std::vector<TokenOutput> tokens;
  FinishReason finish_reason = FinishReason::None;
};

struct RequestUpdate {
  std::vector<ChoiceDelta> choices;  // (n) by choice index
  bool finished = false;   // the request ended: nothing more will come
  std::string error;       // non-empty when the engine failed on the request
  int32_t num_cached_prompt_tokens = 0;
};

// Wakes the reader of several streams (the prompts of one submit_group()) when any of them has
// news: each delivery or end bumps a version, wakes waiters and calls the listener.
class StreamGroup {
 public:
  uint64_t version() const;
  // Waits up to `timeout` for the version to move past `seen`; false on timeout.
  bool wait_for_news(uint64_t seen, std::chrono::milliseconds timeout);
  // An event-driven reader's wake-up, called on the engine loop thread after each news: it must
  // only schedule work (post it elsewhere), never wait or read the streams itself.
  void set_listener(std::function<void()> listener);

 private:
  friend class RequestStream;
  void notify();

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  uint64_t version_ = 0;
  std::function<void()> listener_;
};

class RequestStream {
 public:
  RequestStream(int64_t id, int32_t num_choices, int32_t num_prompt_tokens, std::shared_ptr<StreamGroup> group);

  // Waits up to `timeout` for outputs or the request's end; false on timeout. Otherwise moves
  // everything that arrived since the previous call into `update`.
  bool next(RequestUpdate& update, std::chrono::milliseconds timeout);

  int64_t id() const { return id_; }  // unique per AsyncEngine, in submission order
  int32_t num_choices() const { return num_choices_; }
  int32_t num_prompt_tokens() const { return num_prompt_tokens_; }
  StreamGroup& group() const { return *group_; }  // shared by the streams of one submit_group()

 private:
  friend class AsyncEngine;
  void deliver(SequenceOutput&& output);
  // Ends the stream; unfinished choices get `reason` (Abort for a cancel or a failure).
  void end(FinishReason reason, std::string error);

  const int64_t id_;
  const int32_t num_choices_;
  const int32_t num_prompt_tokens_;
  const std::shared_ptr<StreamGroup> group_;

  std::mutex mutex_;
  std::condition_variable cv_;
  RequestUpdate pending_;
  bool news_ = false;
  bool ended_ = false;

  std::atomic<bool> cancelled_{false};
  // The loop thread's bookkeeping.
  int64_t engine_id_ = -1;
  std::chrono::steady_clock::time_point arrival_;
  bool first_token_seen_ = false;
  std::vector<std::chrono::steady_clock::time_point> last_token_;  // (n) per choice; epoch = none yet
  std::vector<bool> choice_finished_;
};

// One prompt of a submit_group() that Engine::check_request refused; the message names it when the
// group holds several.
class PromptRejected : public Error {
 public:
  PromptRejected(size_t index, const std::string& message) : Error(message), index(index) {}
  size_t index;
};

class SubmitRejected : public std::runtime_error {
 public:
  enum class Reason { QueueFull, ShuttingDown };
  SubmitRejected(Reason reason, const std::string& message) : std::runtime_error(message), reason(reason) {}
  Reason reason;
};

// One prompt of a group and its sampling parameters (max_tokens may differ by prompt length).
struct PromptSubmission {
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
  RequestStart start;     // resumed (failover) or KV imported (Splitwise token instance); n must be 1
  std::string kv_source;  // with start.import_kv: where the KV comes from, for the KV importer (opaque here)
};

// Splitwise token side (splitwise/): starts fetching a reserved request's KV from `source`, without
// blocking (on the loop thread); it ends with AsyncEngine::finish_import or fail_import. Returns
// the fetch's cancel, called if the request ends first.
using KvImportStarter = std::function<std::function<void()>(const KvReservation& reservation, const std::string& source)>;

struct AsyncEngineConfig {
  int32_t max_queued_sequences = 1024;  // waiting sequences (pending + the scheduler's queue)
};

class AsyncEngine {
 public:
  AsyncEngine(Engine& engine, AsyncEngineConfig config);
  ~AsyncEngine();  // stop()
  AsyncEngine(const AsyncEngine&) = delete;
  AsyncEngine& operator=(const AsyncEngine&) = delete;

  // Any thread. Checks the request (Engine::check_request: throws splitflow::Error) and queues it
  // for the loop; throws SubmitRejected when the queue is full or the engine is draining.
  std::shared_ptr<RequestStream> submit(std::vector<int32_t> prompt_ids, const SamplingParams& params, int32_t n);
  // The prompts of one request, n choices each, one stream per prompt (in order), all sharing a
  // StreamGroup. Admitted atomically: every prompt is checked first (PromptRejected names the
  // bad one) and the queue limit counts all their sequences, so either all are queued or none.
  // The loop admits them in one iteration.
  std::vector<std::shared_ptr<RequestStream>> submit_group(std::vector<PromptSubmission> prompts, int32_t n);
  // Any thread, any number of times: the request is aborted at the loop's next iteration, its
  // KV blocks freed and its stream ended (choices "abort"). No-op for an ended stream.
  void cancel(const std::shared_ptr<RequestStream>& stream);

  // Any thread: runs `task` on the loop thread at its next iteration, before admissions and the
  // step (Splitwise's exporter adds its prefill-only requests this way).
  void post(std::function<void(Engine&)> task);
  // Before start(): who fetches the KV of import_kv requests once their blocks are reserved.
  void set_kv_importer(KvImportStarter starter) { kv_importer_ = std::move(starter); }
  // Any thread: the KV of engine request `engine_id` arrived; `write` (run on the loop thread)
  // puts it into the reservation, and the request runs. A request that ended meanwhile is skipped.
  void finish_import(int64_t engine_id, std::function<void()> write);
  // Any thread: the KV will not come; the request ends with `error` (its stream's error), its
  // reserved blocks freed.
  void fail_import(int64_t engine_id, std::string error);

  // Starts the loop thread, which runs run_once() whenever there is work and sleeps otherwise.
  void start();
  // One loop iteration on the calling thread (tests drive the loop step by step with it): admits
  // submitted requests, applies cancels, runs one engine step and delivers its outputs. Returns
  // whether there was anything to do. Never call it while the loop thread runs.
  bool run_once();

  // Refuses new submissions from now on (SubmitRejected::ShuttingDown); in-flight ones go on.
  void begin_drain();
  // Waits until no request is in flight; false on timeout.
  bool wait_until_idle(std::chrono::milliseconds timeout);
  // Stops the loop thread; requests still in flight end with "abort". Idempotent.
  void stop();

  int32_t num_in_flight() const;  // submitted and not yet ended
  const Engine& engine() const { return engine_; }  // read it only from the loop thread
  ServingMetrics& metrics() { return metrics_; }
  std::string render_metrics() const;

 private:
  struct Submission {
    std::shared_ptr<RequestStream> stream;
    std::vector<int32_t> prompt_ids;
    SamplingParams params;
    RequestStart start;
    std::string kv_source;
  };
  // Hands the engine's new KV reservations to the importer.
  void start_imports();

  void loop();
  void admit(Submission& submission);
  void deliver_step(EngineStep& step, std::chrono::steady_clock::time_point now);
  void end_request(int64_t engine_id, FinishReason reason, const std::string& error);
  void publish_gauges();

  Engine& engine_;
  AsyncEngineConfig config_;
  ServingMetrics metrics_;
  const std::chrono::steady_clock::time_point start_time_ = std::chrono::steady_clock::now();

  mutable std::mutex mutex_;
  std::condition_variable wake_;  // the loop: new work or stop
  std::condition_variable idle_;  // wait_until_idle
  std::vector<Submission> pending_;
  int32_t pending_sequences_ = 0;
  std::vector<std::shared_ptr<RequestStream>> cancelled_;
  std::vector<std::function<void(Engine&)>> tasks_;  // post()
  int32_t waiting_sequences_ = 0;  // the engine's, after the latest step
  int32_t num_in_flight_ = 0;
  int64_t next_stream_id_ = 0;
  bool draining_ = false;
  bool stopping_ = false;

  // The loop thread's own.
  std::unordered_map<int64_t, std::shared_ptr<RequestStream>> active_;  // by engine request id
  KvImportStarter kv_importer_;
  std::unordered_map<int64_t, std::string> import_sources_;               // import_kv requests not reserved yet
  std::unordered_map<int64_t, std::function<void()>> import_cancels_;     // imports in flight
  bool engine_busy_ = false;
  std::thread thread_;
};

}  // namespace splitflow
