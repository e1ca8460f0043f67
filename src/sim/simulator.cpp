#include "sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace splitflow::sim {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
}

Simulation::Simulation(ClusterConfig config, const PerfModel& perf_model, std::vector<Request> requests,
                       SimulationOptions options)
    : config_(std::move(config)), perf_model_(perf_model), requests_(std::move(requests)), options_(options) {
  for (const PoolConfig& pool : config_.pools) {
    const MachineType& machine = config_.machine_type(pool.machine_type);
    for (int i = 0; i < pool.count; ++i) {
      Instance instance;
      instance.id = cluster_.size();
      instance.name = fmt::format("{}_{}", machine.name, instance.id);
      instance.machine = &machine;
      instance.perf_key = PerfKey{config_.model.name, machine.hardware, pool.tensor_parallel};
      SF_CHECK(perf_model_.contains(instance.perf_key),
               "cluster config '{}': the perf model has no profile for model '{}' on hardware '{}' at TP{}",
               config_.name, config_.model.name, machine.hardware, pool.tensor_parallel);
      instance.perf = &perf_model_.curves(instance.perf_key);
      SF_CHECK(config_.kv_transfer.timing != KvTransferTiming::Profile || instance.perf->kv_transfer_time_s,
               "cluster config '{}': kv_transfer.timing is 'profile' but the perf model has no kv_transfer rows for "
               "model '{}' on hardware '{}' at TP{}", config_.name, config_.model.name, machine.hardware,
               pool.tensor_parallel);
      instance.home_pool = instance.pool = pool.role;
      instance.max_memory_bytes = static_cast<int64_t>(pool.tensor_parallel) * machine.gpu_memory_bytes;
      SF_CHECK(instance.max_memory_bytes > config_.model.weights_bytes,
               "cluster config '{}': model '{}' ({} B of weights) does not fit in {} GPUs of '{}'", config_.name,
               config_.model.name, config_.model.weights_bytes, pool.tensor_parallel, machine.name);
      instance.memory_bytes = instance.sched_memory_bytes = config_.model.weights_bytes;
      cluster_.add(std::move(instance));
    }
  }
  SF_CHECK(cluster_.size() > 0, "cluster config '{}': no machines", config_.name);

  results_.resize(requests_.size());
  states_.resize(requests_.size());
  prompt_run_s_.assign(requests_.size(), 0.0);
  for (size_t r = 0; r < requests_.size(); ++r) {
    const Request& request = requests_[r];
    SF_CHECK(request.prompt_tokens > 0 && request.output_tokens > 0,
             "request {}: prompt_tokens and output_tokens must be positive, got {} and {}", request.id,
             request.prompt_tokens, request.output_tokens);
    SF_CHECK(std::isfinite(request.arrival_s) && request.arrival_s >= 0,
             "request {}: arrival time must be finite and non-negative, got {}", request.id, request.arrival_s);
    RequestResult& result = results_[r];
    result.id = request.id;
    result.arrival_s = request.arrival_s;
    result.prompt_tokens = request.prompt_tokens;
    result.output_tokens = request.output_tokens;
  }
  cluster_scheduler_ = make_cluster_scheduler(config_);
  machine_scheduler_ = make_machine_scheduler(config_, requests_);
}

Simulation::~Simulation() = default;

void Cluster::add(Instance instance) {
  SF_CHECK(instance.id == size(), "cluster: instance id {} added at position {}", instance.id, size());
  instances_.push_back(std::move(instance));
  link(instances_.back());
}

void MinTree::set(int id, int64_t value) {
  if (static_cast<size_t>(id) >= leaves_) {
    size_t leaves = std::max<size_t>(leaves_, 1);
    while (leaves <= static_cast<size_t>(id)) leaves *= 2;
    std::vector<Entry> nodes(2 * leaves, kAbsent);
    for (size_t i = 0; i < leaves_; ++i) nodes[leaves + i] = nodes_[leaves_ + i];
    for (size_t i = leaves - 1; i >= 1; --i) nodes[i] = std::min(nodes[2 * i], nodes[2 * i + 1]);
    nodes_ = std::move(nodes);
    leaves_ = leaves;
  }
  update(static_cast<size_t>(id), Entry{value, id});
}

void MinTree::erase(int id) {
  if (static_cast<size_t>(id) < leaves_) update(static_cast<size_t>(id), kAbsent);
}

void MinTree::update(size_t leaf, Entry entry) {
  size_t node = leaves_ + leaf;
  nodes_[node] = entry;
  // Stop once a subtree's minimum is unchanged: nothing above it changes either.
  for (node /= 2; node >= 1; node /= 2) {
    const Entry smaller = std::min(nodes_[2 * node], nodes_[2 * node + 1]);
    if (nodes_[node] == smaller) break;
    nodes_[node] = smaller;
  }
}

void Cluster::unlink(const Instance& instance) {
  by_pending_[slot(instance.pool)].erase(instance.id);
  by_memory_[slot(instance.pool)].erase(instance.id);
  all_by_pending_.erase(instance.id);
}

void Cluster::link(const Instance& instance) {
  by_pending_[slot(instance.pool)].set(instance.id, instance.sched_pending_tokens);
  by_memory_[slot(instance.pool)].set(instance.id, instance.sched_memory_bytes);
  all_by_pending_.set(instance.id, instance.sched_pending_tokens);
}

void Cluster::add_pending_tokens(int i, int64_t delta) {
  Instance& instance = instances_[i];
  instance.sched_pending_tokens += delta;
  by_pending_[slot(instance.pool)].set(i, instance.sched_pending_tokens);
  all_by_pending_.set(i, instance.sched_pending_tokens);
}

void Cluster::add_sched_memory(int i, int64_t delta) {
  Instance& instance = instances_[i];
  instance.sched_memory_bytes += delta;
  by_memory_[slot(instance.pool)].set(i, instance.sched_memory_bytes);
}

void Cluster::set_pool(int i, InstanceRole pool) {
  unlink(instances_[i]);
  instances_[i].pool = pool;
  link(instances_[i]);
}

void BatchTime::add(int batch_size, int64_t batch_tokens, double seconds) {
  if (seconds_by_batch_size.size() <= static_cast<size_t>(batch_size)) seconds_by_batch_size.resize(batch_size + 1, 0.0);
  if (seconds_by_batch_tokens.size() <= static_cast<size_t>(batch_tokens))
    seconds_by_batch_tokens.resize(batch_tokens + 1, 0.0);
  seconds_by_batch_size[batch_size] += seconds;
  seconds_by_batch_tokens[batch_tokens] += seconds;
}

void Simulation::push(double time_s, EventKind kind, int target, uint64_t generation) {
  events_.push(Event{time_s, next_sequence_++, kind, target, generation});
}

SimulationResult Simulation::run() {
  // Arrivals are merged in from a sorted list rather than queued up front: the heap then holds
  // only run ends and transfers (about one per instance), not the whole trace. At equal times an
  // arrival goes first, and arrivals keep input order.
  std::vector<int> arrival_order(requests_.size());
  std::iota(arrival_order.begin(), arrival_order.end(), 0);
  std::stable_sort(arrival_order.begin(), arrival_order.end(),
                   [&](int a, int b) { return requests_[a].arrival_s < requests_[b].arrival_s; });
  size_t next_arrival = 0;
  SimulationResult result;
  double now = 0;
  while (!stop_requested_ && (next_arrival < arrival_order.size() || !events_.empty())) {
    ++result.events;
    if (next_arrival < arrival_order.size() &&
        (events_.empty() || requests_[arrival_order[next_arrival]].arrival_s <= events_.top().time_s)) {
      const int r = arrival_order[next_arrival++];
      now = requests_[r].arrival_s;
      on_arrival(r, now);
      continue;
    }
    const Event event = events_.top();
    events_.pop();
    now = event.time_s;
    switch (event.kind) {
      case EventKind::RunEnd: on_run_end(event.target, event.generation, now); break;
      case EventKind::TransferTry: on_transfer_try(event.target, now); break;
      case EventKind::TransferEnd: on_transfer_end(event.target, now); break;
    }
  }
  // A request left unfinished with no event pending either never fits its instances (a config
  // error) or is stalled: KV is reserved in full up front, so queued decodes holding their prompt's
  // KV can fill an instance that then never has room to start any of them.
  for (size_t r = 0; r < requests_.size() && !stop_requested_; ++r) {
    if (states_[r].phase == Phase::Done) continue;
    const Request& request = requests_[r];
    const Instance& prompt_instance = cluster_[results_[r].prompt_instance];
    const Instance& token_instance = cluster_[results_[r].token_instance];
    const int64_t weights = config_.model.weights_bytes;
    const bool prompt_fits = kv_bytes(request.prompt_tokens + 1) <= prompt_instance.max_memory_bytes - weights;
    const bool token_fits =
        kv_bytes(request.prompt_tokens + request.output_tokens) <= token_instance.max_memory_bytes - weights;
    SF_CHECK(prompt_fits && token_fits,
             "simulation of '{}': request {} (prompt {} tokens, output {}) can never fit on {}: its KV exceeds the "
             "instance's memory after the weights", config_.name, request.id, request.prompt_tokens,
             request.output_tokens, prompt_fits ? token_instance.name : prompt_instance.name);
    ++result.stalled_requests;
  }
  result.requests = std::move(results_);
  result.iterations = std::move(iterations_);
  result.batch_time = std::move(batch_time_);
  result.finished_requests = finished_requests_;
  result.stopped_early = stop_requested_;
  result.end_time_s = now;
  return result;
}

void Simulation::on_arrival(int r, double now) {
  const Request& request = requests_[r];
  const Placement placement = cluster_scheduler_->place(request, cluster_);
  RequestResult& result = results_[r];
  result.prompt_instance = placement.prompt_instance;
  result.token_instance = placement.token_instance;
  // The scheduler's memory view: prompt KV on the prompt instance until transferred, and the whole
  // request's KV on the token instance.
  const int64_t prompt_kv = task_kv_bytes(config_.model, request, Phase::Prompt);
  const int64_t decode_kv = task_kv_bytes(config_.model, request, Phase::Decode);
  cluster_.add_sched_memory(placement.token_instance, prompt_kv + decode_kv);
  if (placement.prompt_instance != placement.token_instance)
    cluster_.add_sched_memory(placement.prompt_instance, prompt_kv);
  enqueue_task(placement.prompt_instance, r, now);
}

void Simulation::enqueue_task(int i, int r, double now) {
  Instance& instance = cluster_[i];
  machine_scheduler_->enqueue(instance, r, states_);
  if (!instance.busy) {
    start_run(i, now);
    return;
  }
  // A decode block is cut at the next iteration boundary when the new task could join the batch.
  if (instance.batch_has_prompt || instance.planned_iterations <= 1) return;
  const bool joins = states_[r].phase == Phase::Prompt ||
                     (static_cast<int>(instance.batch.size()) < config_.instance.max_batch_size &&
                      instance.batch_tokens + 1 <= config_.instance.max_batch_tokens);
  if (!joins) return;
  const int64_t done = iterations_reached(instance, now - instance.run_start_s);
  if (done >= instance.planned_iterations) return;
  instance.planned_iterations = done;
  ++instance.generation;
  push(instance.run_start_s + run_elapsed_s(instance, done), EventKind::RunEnd, i, instance.generation);
}

double Simulation::run_elapsed_s(const Instance& instance, int64_t iterations) const {
  if (!instance.steps_grow_with_context) return static_cast<double>(iterations) * instance.iteration_s;
  return instance.perf->decode_block_time_s(static_cast<int64_t>(instance.batch.size()), instance.decode_mean_context,
                                            iterations);
}

int64_t Simulation::iterations_reached(const Instance& instance, double elapsed_s) const {
  if (!instance.steps_grow_with_context) {
    const double elapsed_iterations = elapsed_s / instance.iteration_s;
    return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(elapsed_iterations - 1e-9)));
  }
  // The first n whose end is not before elapsed_s (same tolerance: 1e-9 of an iteration).
  const double target_s = elapsed_s - 1e-9 * instance.iteration_s;
  int64_t lo = 1, hi = instance.planned_iterations;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (run_elapsed_s(instance, mid) >= target_s) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

void Simulation::start_run(int i, double now) {
  Instance& instance = cluster_[i];
  machine_scheduler_->select_batch(instance, states_);
  if (instance.batch.empty()) {
    instance.busy = false;
    if (instance.idle() && instance.pool != instance.home_pool) cluster_.set_pool(i, instance.home_pool);
    return;
  }
  int prompt_tasks = 0;
  int64_t batch_tokens = 0;
  int64_t prompt_tokens = 0;
  double context_tokens = 0;  // over the decodes: tokens in their caches at this step
  int64_t iterations = std::numeric_limits<int64_t>::max();
  for (int r : instance.batch) {
    RequestState& state = states_[r];
    if (!state.task_started) {
      state.task_started = true;
      instance.memory_bytes += task_kv_bytes(config_.model, requests_[r], state.phase);
      if (state.phase == Phase::Prompt) {
        state.kv_tokens_at_prompt_instance += requests_[r].prompt_tokens + 1;
        results_[r].prompt_start_s = now;
      } else {
        state.kv_tokens_at_token_instance += requests_[r].output_tokens - 1;
        results_[r].decode_start_s = now;
      }
    }
    if (state.phase == Phase::Prompt) {
      ++prompt_tasks;
      batch_tokens += requests_[r].prompt_tokens;
      prompt_tokens += requests_[r].prompt_tokens;
    } else {
      batch_tokens += 1;
      iterations = std::min(iterations, state.decode_remaining);
      // The prompt and every token generated before this step (the first came with the prompt).
      context_tokens += static_cast<double>(requests_[r].prompt_tokens + requests_[r].output_tokens - 1 -
                                            state.decode_remaining);
    }
  }
  const int64_t decodes = static_cast<int64_t>(instance.batch.size()) - prompt_tasks;
  const double mean_context = decodes > 0 ? context_tokens / static_cast<double>(decodes) : 0.0;
  if (prompt_tasks > 0) iterations = 1;
  instance.busy = true;
  instance.batch_has_prompt = prompt_tasks > 0;
  instance.batch_tokens = batch_tokens;
  instance.run_start_s = now;
  instance.iteration_s =
      instance.perf->batch_time_s(prompt_tokens, decodes, mean_context, config_.instance.mixed_batch_factor);
  instance.steps_grow_with_context =
      prompt_tasks == 0 && instance.perf->decode_model == DecodeModel::ContextAware;
  instance.decode_mean_context = mean_context;
  instance.planned_iterations = iterations;
  ++instance.generation;
  push(now + run_elapsed_s(instance, iterations), EventKind::RunEnd, i, instance.generation);
  if (options_.record_iterations) {
    instance.record_index = iterations_.size();
    iterations_.push_back(IterationRecord{i, now, 0, static_cast<int>(instance.batch.size()), prompt_tasks,
                                          batch_tokens, iterations, instance.memory_bytes});
  }
}

void Simulation::on_run_end(int i, uint64_t generation, double now) {
  Instance& instance = cluster_[i];
  if (generation != instance.generation) return;  // superseded by a cut
  const int64_t done = instance.planned_iterations;
  batch_time_[static_cast<size_t>(instance.home_pool)].add(static_cast<int>(instance.batch.size()),
                                                          instance.batch_tokens, now - instance.run_start_s);
  if (options_.record_iterations) {
    iterations_[instance.record_index].end_s = now;
    iterations_[instance.record_index].iterations = done;
  }
  finished_batch_.swap(instance.batch);  // the next batch is built in instance.batch
  instance.batch.clear();
  instance.busy = false;
  for (int r : finished_batch_) {
    RequestState& state = states_[r];
    if (state.phase == Phase::Prompt) {
      prompt_run_s_[r] = now - instance.run_start_s;
      finish_prompt(i, r, now);
      continue;
    }
    state.decode_remaining -= done;
    if (state.decode_remaining == 0) {
      finish_request(r, now);
    } else {
      instance.batch.push_back(r);
    }
  }
  start_run(i, now);
}

void Simulation::finish_prompt(int i, int r, double now) {
  Instance& instance = cluster_[i];
  RequestState& state = states_[r];
  const Request& request = requests_[r];
  results_[r].prompt_end_s = now;
  cluster_.add_pending_tokens(i, -request.prompt_tokens);
  state.task_started = false;
  state.decode_remaining = request.output_tokens - 1;
  if (state.decode_remaining == 0) {
    results_[r].decode_start_s = now;
    finish_request(r, now);
    return;
  }
  const int token_instance = results_[r].token_instance;
  if (token_instance == i) {
    // Same instance: the decode is chained onto the prompt and keeps its KV in place.
    state.phase = Phase::Decode;
    state.kv_tokens_at_token_instance = state.kv_tokens_at_prompt_instance;
    state.kv_tokens_at_prompt_instance = 0;
    machine_scheduler_->enqueue(instance, r, states_);
    return;
  }
  state.phase = Phase::Transfer;
  on_transfer_try(r, now);
}

void Simulation::on_transfer_try(int r, double now) {
  const Request& request = requests_[r];
  Instance& destination = cluster_[results_[r].token_instance];
  const int64_t kv = task_kv_bytes(config_.model, request, Phase::Prompt);
  if (destination.memory_bytes + kv > destination.max_memory_bytes) {
    push(now + config_.kv_transfer.retry_interval_s, EventKind::TransferTry, r);
    return;
  }
  destination.memory_bytes += kv;
  states_[r].kv_tokens_at_token_instance = request.prompt_tokens + 1;
  // The cache of prompt_tokens tokens moves; the first generated token's slot is allocated in place.
  const double serialized_s = kv_transfer_s(cluster_[results_[r].prompt_instance], request.prompt_tokens);
  double visible_s = serialized_s;
  // A retried transfer starts after the prefill (the destination had no room): nothing was streamed
  // during it, so the whole cache moves now.
  const bool first_try = now == results_[r].prompt_end_s;
  if (config_.kv_transfer.mode == KvTransferMode::LayerwiseOverlapped && first_try) {
    // Layer l's KV leaves while layer l+1 computes: only what outlasts the prefill, or at least the
    // last layer's share, remains after the prompt iteration ends.
    const double layers = config_.model.num_layers;
    const double hidden_s = prompt_run_s_[r] * (layers - 1) / layers;
    visible_s = std::max(serialized_s - hidden_s, serialized_s / layers);
  }
  push(now + visible_s, EventKind::TransferEnd, r);
}

double Simulation::kv_transfer_s(const Instance& prompt_instance, int64_t prompt_tokens) const {
  if (config_.kv_transfer.timing == KvTransferTiming::Profile)
    return (*prompt_instance.perf->kv_transfer_time_s)(static_cast<double>(prompt_tokens));
  const double bytes = static_cast<double>(prompt_tokens) * static_cast<double>(config_.model.kv_bytes_per_token);
  return bytes / (config_.kv_transfer.bandwidth_gib_per_s * kGiB);
}

void Simulation::on_transfer_end(int r, double now) {
  RequestState& state = states_[r];
  const int source = results_[r].prompt_instance;
  Instance& prompt_instance = cluster_[source];
  const int64_t freed = kv_bytes(state.kv_tokens_at_prompt_instance);
  prompt_instance.memory_bytes -= freed;
  cluster_.add_sched_memory(source, -freed);
  state.kv_tokens_at_prompt_instance = 0;
  state.phase = Phase::Decode;
  // Freed memory may let the prompt instance start waiting work.
  if (!prompt_instance.busy && prompt_instance.waiting.has_queued()) start_run(source, now);
  enqueue_task(results_[r].token_instance, r, now);
}

void Simulation::finish_request(int r, double now) {
  RequestState& state = states_[r];
  const Request& request = requests_[r];
  const int token_id = results_[r].token_instance;
  const int prompt_id = results_[r].prompt_instance;
  Instance& token_instance = cluster_[token_id];
  Instance& prompt_instance = cluster_[prompt_id];
  results_[r].completion_s = now;
  results_[r].finished = true;
  cluster_.add_pending_tokens(token_id, -1);
  cluster_.add_sched_memory(token_id, -kv_bytes(request.prompt_tokens + request.output_tokens));
  token_instance.memory_bytes -= kv_bytes(state.kv_tokens_at_token_instance);
  // Only a one-token request finishes with its KV still on a separate prompt instance.
  const int64_t prompt_kv = kv_bytes(state.kv_tokens_at_prompt_instance);
  prompt_instance.memory_bytes -= prompt_kv;
  if (prompt_id != token_id) cluster_.add_sched_memory(prompt_id, -prompt_kv);
  state.kv_tokens_at_token_instance = state.kv_tokens_at_prompt_instance = 0;
  state.phase = Phase::Done;
  state.task_started = false;
  ++finished_requests_;
  if (options_.stop_when && options_.stop_when(results_[r])) stop_requested_ = true;
}

}  // namespace splitflow::sim
