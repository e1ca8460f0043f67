// sim/simulator.h — the discrete-event cluster simulator: requests arrive, a cluster-level
// scheduler places their prompt and token phases on instances (one per machine), each instance's
// machine-level scheduler forms batches at iteration boundaries, iteration times come from the
// PerfModel, and KV caches move between machines over a link. Owns the event queue, the request
// and instance state and the per-request results. Pure C++: never touches engine or GPU code.
#pragma once

#include <cstdint>
#include <array>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <queue>
#include <set>
#include <string>
#include <vector>

#include "sim/config.h"
#include "sim/perf_model.h"

namespace splitflow::sim {

struct Request {
  int64_t id = 0;
  double arrival_s = 0;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;  // includes the first token, which the prompt phase produces
};

// Per-request outcome; times are absolute simulation seconds.
struct RequestResult {
  int64_t id = 0;
  double arrival_s = 0;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int prompt_instance = -1;
  int token_instance = -1;
  double prompt_start_s = 0;
  double prompt_end_s = 0;     // first token
  double decode_start_s = 0;   // equals prompt_end_s plus KV transfer and queueing
  double completion_s = 0;
  bool finished = false;       // false only for requests left when a run is stopped early

  double ttft_s() const { return prompt_end_s - arrival_s; }
  double e2e_s() const { return completion_s - arrival_s; }
  // SplitwiseSim divides by output_tokens (not output_tokens - 1); kept for comparability.
  double tbt_s() const { return (e2e_s() - ttft_s()) / static_cast<double>(output_tokens); }
  double nth_token_overhead_s() const { return decode_start_s - prompt_end_s; }
};

// One batch run: a prompt iteration, or a block of back-to-back decode iterations.
struct IterationRecord {
  int instance = 0;
  double start_s = 0;
  double end_s = 0;
  int batch_size = 0;
  int prompt_tasks = 0;
  int64_t batch_tokens = 0;
  int64_t iterations = 0;
  int64_t memory_bytes = 0;  // weights + KV in use during the run
};

enum class Phase { Prompt, Transfer, Decode, Done };

// A waiting task's place in the aging order (see WaitQueue::by_age).
struct WaitKey {
  int64_t age = 0;         // num_preemptions − the instance's batch formations when it began waiting
  double arrival_s = 0;    // request arrival
  int group = 0;           // 0: queued, 1: preempted (queued tasks first among equals)
  uint64_t sequence = 0;   // order of entry among equals
  int request = 0;
  auto operator<=>(const WaitKey&) const = default;
};

// A request's progress; it has at most one task (prompt or decode) at any time.
struct RequestState {
  Phase phase = Phase::Prompt;
  bool task_started = false;      // the current task holds its KV and has run
  int64_t decode_remaining = 0;   // decode iterations left (output_tokens - 1 at start)
  int64_t num_preemptions = 0;    // times passed over while waiting (aging); current while not waiting
  bool waiting = false;           // queued or preempted on its instance; then see wait_key
  WaitKey wait_key;
  int64_t kv_tokens_at_prompt_instance = 0;
  int64_t kv_tokens_at_token_instance = 0;
};

// Tasks placed on an instance and not running. Kept so that forming a batch costs about the batch
// size (plus log of the queue), not the queue length: under overload prompts queue without bound.
struct WaitQueue {
  std::deque<int> prompts;   // queued prompts in arrival order (a prompt is queued when it arrives)
  std::vector<int> decodes;  // queued decodes by (arrival, entry); each holds KV here, so they are few
  std::vector<int> blocked;  // started decodes preempted out of the batch (keep their KV), in order
  // Every waiting task by (num_preemptions, arrival, queued before preempted, entry). Each batch
  // formation ages every waiting task it passes over by one, all alike, so the order is fixed
  // while a task waits and num_preemptions = key.age + formations needs no per-task update.
  std::set<WaitKey> by_age;
  int64_t formations = 0;

  bool has_queued() const { return !prompts.empty() || !decodes.empty(); }
  bool empty() const { return !has_queued() && blocked.empty(); }
};

struct Instance {
  int id = 0;
  std::string name;
  const MachineType* machine = nullptr;
  PerfKey perf_key;
  const PerfCurves* perf = nullptr;  // the perf model's curves for perf_key
  InstanceRole home_pool = InstanceRole::Mixed;
  int64_t max_memory_bytes = 0;
  int64_t memory_bytes = 0;         // weights + KV allocated by running/finished tasks
  // The scheduler's view; change only through Cluster, which keeps them ordered.
  InstanceRole pool = InstanceRole::Mixed;  // a borrowed instance sits in Mixed until idle
  int64_t sched_memory_bytes = 0;   // weights + KV promised at placement
  int64_t sched_pending_tokens = 0; // prompt tokens + decodes not yet done

  // Machine-level state; entries are request indices. Change `waiting` only through the
  // MachineScheduler.
  WaitQueue waiting;
  std::vector<int> batch;    // tasks of the run in progress
  bool busy = false;
  bool batch_has_prompt = false;
  int64_t batch_tokens = 0;
  double run_start_s = 0;
  double iteration_s = 0;            // the run's first iteration
  // Context-aware decode blocks: each step's caches are one token longer, so step times grow
  // (PerfCurves::decode_block_time_s); otherwise every iteration takes iteration_s.
  bool steps_grow_with_context = false;
  double decode_mean_context = 0;    // at the block's first step
  int64_t planned_iterations = 0;
  size_t record_index = 0;  // this run's IterationRecord, when recorded
  uint64_t generation = 0;  // invalidates a run-end event when a decode block is cut short

  bool idle() const { return batch.empty() && waiting.empty(); }
};

// Minimum of (value, id) over ids, with point updates in O(log n): a flat tournament tree, so the
// cluster scheduler's views stay cache-friendly at thousands of instances (a node-based ordered set
// cost several times more per event at 10,000 machines).
class MinTree {
 public:
  void set(int id, int64_t value);  // grows to hold id
  void erase(int id);
  int min_id() const { return nodes_.empty() || nodes_[1] == kAbsent ? -1 : nodes_[1].second; }

 private:
  using Entry = std::pair<int64_t, int>;  // (value, id): ties go to the lowest id
  static constexpr Entry kAbsent{std::numeric_limits<int64_t>::max(), std::numeric_limits<int>::max()};
  void update(size_t leaf, Entry entry);
  size_t leaves_ = 0;
  std::vector<Entry> nodes_;  // nodes_[1] is the root; leaf i at nodes_[leaves_ + i]
};

// The instances and the scheduler's ordered views of them: per pool by sched_pending_tokens and by
// sched_memory_bytes (ties: lowest id), so a placement costs O(log N), not a scan of the cluster.
class Cluster {
 public:
  void add(Instance instance);  // instance.id must equal size()
  int size() const { return static_cast<int>(instances_.size()); }
  Instance& operator[](int i) { return instances_[i]; }
  const Instance& operator[](int i) const { return instances_[i]; }
  const std::vector<Instance>& instances() const { return instances_; }

  void add_pending_tokens(int i, int64_t delta);
  void add_sched_memory(int i, int64_t delta);
  void set_pool(int i, InstanceRole pool);
  // Instance ids, or -1 when the pool is empty.
  int least_pending(InstanceRole pool) const { return by_pending_[slot(pool)].min_id(); }
  int least_sched_memory(InstanceRole pool) const { return by_memory_[slot(pool)].min_id(); }
  int least_pending_overall() const { return all_by_pending_.min_id(); }

 private:
  static size_t slot(InstanceRole pool) { return static_cast<size_t>(pool); }
  void unlink(const Instance& instance);
  void link(const Instance& instance);

  std::vector<Instance> instances_;
  std::array<MinTree, 3> by_pending_;  // per pool
  std::array<MinTree, 3> by_memory_;   // per pool
  MinTree all_by_pending_;
};

struct Placement {
  int prompt_instance = -1;
  int token_instance = -1;
};

// Cluster-level scheduler: places each request's two phases on arrival.
class ClusterScheduler {
 public:
  virtual ~ClusterScheduler() = default;
  // Chooses instances and raises their sched_pending_tokens; may move instances between pools.
  virtual Placement place(const Request& request, Cluster& cluster) = 0;
};

// Machine-level scheduler: forms the next batch of an instance at an iteration boundary.
class MachineScheduler {
 public:
  virtual ~MachineScheduler() = default;
  // Queues request r's current task (a prompt on arrival, a decode after its prefill or transfer).
  virtual void enqueue(Instance& instance, int r, std::vector<RequestState>& states) = 0;
  // Replaces instance.batch with the tasks of the next run; decodes dropped from the old batch are
  // preempted. Must keep the KV that newly started tasks need within max_memory_bytes.
  virtual void select_batch(Instance& instance, std::vector<RequestState>& states) = 0;
};

std::unique_ptr<ClusterScheduler> make_cluster_scheduler(const ClusterConfig& config);
std::unique_ptr<MachineScheduler> make_machine_scheduler(const ClusterConfig& config,
                                                         const std::vector<Request>& requests);

// KV bytes a task must hold when it starts: prompt+1 tokens for a prompt, output-1 for a decode.
int64_t task_kv_bytes(const ModelConfig& model, const Request& request, Phase phase);

// Busy time of one pool's instances by the size of the batch they ran (Splitwise Fig. 17):
// seconds_by_batch_size[n] is the time spent running batches of n tasks, seconds_by_batch_tokens[x]
// the time spent on batches of x tokens (prompt tokens + one per decode).
struct BatchTime {
  std::vector<double> seconds_by_batch_size;
  std::vector<double> seconds_by_batch_tokens;
  void add(int batch_size, int64_t batch_tokens, double seconds);
};

struct SimulationResult {
  std::vector<RequestResult> requests;    // in input order; unfinished ones when stopped early
  std::vector<IterationRecord> iterations;  // when recorded
  std::array<BatchTime, 3> batch_time;    // by the instances' home pool (index: InstanceRole)
  int64_t events = 0;
  int64_t finished_requests = 0;
  bool stopped_early = false;             // SimulationOptions::stop_when asked to stop
  // Requests that never finished although they fit their instances: with KV reserved up front,
  // queued decodes holding their prompts' KV can fill an instance that then cannot start any of
  // them (SplitwiseSim's model has the same stall). They count as failing every SLO.
  int64_t stalled_requests = 0;
  double end_time_s = 0;
};

struct SimulationOptions {
  bool record_iterations = false;
  // Called with each finished request; returning true ends the run at once (e.g. when an SLO can no
  // longer be met), leaving the other requests unfinished.
  std::function<bool(const RequestResult&)> stop_when = nullptr;
};

class Simulation {
 public:
  Simulation(ClusterConfig config, const PerfModel& perf_model, std::vector<Request> requests,
             SimulationOptions options = {});
  ~Simulation();
  SimulationResult run();

  const std::vector<Instance>& instances() const { return cluster_.instances(); }

 private:
  enum class EventKind { RunEnd, TransferTry, TransferEnd };
  struct Event {
    double time_s;
    uint64_t sequence;  // FIFO among equal times, so runs are deterministic
    EventKind kind;
    int target;         // instance index (RunEnd) or request index
    uint64_t generation;
    bool operator>(const Event& other) const {
      return time_s != other.time_s ? time_s > other.time_s : sequence > other.sequence;
    }
  };

  void push(double time_s, EventKind kind, int target, uint64_t generation = 0);
  void on_arrival(int request, double now);
  void on_run_end(int instance, uint64_t generation, double now);
  void on_transfer_try(int request, double now);
  void on_transfer_end(int request, double now);
  void enqueue_task(int instance, int request, double now);
  void start_run(int instance, double now);
  void finish_prompt(int instance, int request, double now);
  void finish_request(int request, double now);
  int64_t kv_bytes(int64_t tokens) const { return tokens * config_.model.kv_bytes_per_token; }
  // Seconds from a run's start to the end of its first `iterations` iterations.
  double run_elapsed_s(const Instance& instance, int64_t iterations) const;
  // Iterations of the run in progress that have ended or are running at `elapsed_s` (at least 1).
  int64_t iterations_reached(const Instance& instance, double elapsed_s) const;
  double kv_transfer_s(const Instance& prompt_instance, int64_t prompt_tokens) const;

  ClusterConfig config_;
  const PerfModel& perf_model_;
  std::vector<Request> requests_;
  SimulationOptions options_;
  std::vector<RequestState> states_;
  std::vector<RequestResult> results_;
  Cluster cluster_;
  std::vector<double> prompt_run_s_;  // per request: duration of the iteration that ran its prompt
  std::unique_ptr<ClusterScheduler> cluster_scheduler_;
  std::unique_ptr<MachineScheduler> machine_scheduler_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t next_sequence_ = 0;
  std::vector<IterationRecord> iterations_;
  std::array<BatchTime, 3> batch_time_;
  std::vector<int> finished_batch_;  // on_run_end's scratch: the batch that just ran
  int64_t finished_requests_ = 0;
  bool stop_requested_ = false;
};

}  // namespace splitflow::sim
