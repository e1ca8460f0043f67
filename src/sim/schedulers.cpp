// The policies SplitwiseSim uses for the paper's results (described in
// ../shared/sim-reference/README.md): token_jsq and mixed_pool at the cluster level, and the
// "Splitwise" instance's five-list batch selection at the machine level.
#include <algorithm>
#include <limits>

#include "core/error.h"
#include "sim/simulator.h"

namespace splitflow::sim {

int64_t task_kv_bytes(const ModelConfig& model, const Request& request, Phase phase) {
  const int64_t tokens = phase == Phase::Prompt ? request.prompt_tokens + 1 : request.output_tokens - 1;
  return tokens * model.kv_bytes_per_token;
}

namespace {

// Baselines: both phases on the instance with the fewest pending tokens.
class TokenJsqScheduler : public ClusterScheduler {
 public:
  Placement place(const Request& request, Cluster& cluster) override {
    const int best = cluster.least_pending_overall();
    SF_CHECK(best >= 0, "token_jsq scheduler: the cluster has no instances");
    cluster.add_pending_tokens(best, request.prompt_tokens + 1);
    return {best, best};
  }
};

// Splitwise: prompt pool, token pool and a dynamic mixed pool of borrowed instances.
class MixedPoolScheduler : public ClusterScheduler {
 public:
  MixedPoolScheduler(const ClusterConfig& config) : config_(config) {}

  Placement place(const Request& request, Cluster& cluster) override {
    int prompt = find_prompt_instance(request, cluster);
    int token = find_token_instance(request, cluster);
    if (prompt < 0) {
      prompt = cluster.least_pending(InstanceRole::Token);
      if (prompt >= 0) cluster.set_pool(prompt, InstanceRole::Mixed);
    }
    if (token < 0) {
      token = cluster.least_sched_memory(InstanceRole::Prompt);
      if (token >= 0) cluster.set_pool(token, InstanceRole::Mixed);
    }
    if (prompt < 0 || token < 0) {
      const int best = cluster.least_pending_overall();
      SF_CHECK(best >= 0, "mixed_pool scheduler: the cluster has no instances");
      prompt = token = best;
    }
    cluster.add_pending_tokens(prompt, request.prompt_tokens);
    cluster.add_pending_tokens(token, 1);
    return {prompt, token};
  }

 private:
  int find_prompt_instance(const Request& request, const Cluster& cluster) const {
    for (InstanceRole pool : {InstanceRole::Prompt, InstanceRole::Mixed}) {
      const int best = cluster.least_pending(pool);
      if (best < 0) continue;
      const Instance& instance = cluster[best];
      const bool overloaded = instance.waiting.has_queued() &&
                              instance.sched_pending_tokens + request.prompt_tokens >
                                  config_.scheduler.prompt_max_pending_batch_tokens;
      if (!overloaded) return best;
    }
    return -1;
  }

  int find_token_instance(const Request& request, const Cluster& cluster) const {
    const int64_t kv = task_kv_bytes(config_.model, request, Phase::Prompt) +
                       task_kv_bytes(config_.model, request, Phase::Decode);
    for (InstanceRole pool : {InstanceRole::Token, InstanceRole::Mixed}) {
      const int best = cluster.least_sched_memory(pool);
      if (best < 0) continue;
      if (cluster[best].sched_memory_bytes + kv < cluster[best].max_memory_bytes) return best;
    }
    return -1;
  }

  const ClusterConfig& config_;
};

// SplitwiseSim's "Splitwise" instance: scans five lists at every iteration boundary (see
// docs/simulator.md); a list's scan stops at the first task that does not fit. The waiting tasks
// live in ordered structures (WaitQueue), so a formation visits the tasks it selects plus the one
// that stopped each scan, never the whole queue.
class SplitwiseMachineScheduler : public MachineScheduler {
 public:
  SplitwiseMachineScheduler(const ClusterConfig& config, const std::vector<Request>& requests)
      : config_(config), requests_(requests) {}

  void enqueue(Instance& instance, int r, std::vector<RequestState>& states) override {
    WaitQueue& waiting = instance.waiting;
    if (states[r].phase == Phase::Prompt) {
      waiting.prompts.push_back(r);
    } else {
      // After every decode that arrived (as a request) no later than this one.
      const auto at = std::upper_bound(waiting.decodes.begin(), waiting.decodes.end(), r, [&](int a, int b) {
        return requests_[a].arrival_s < requests_[b].arrival_s;
      });
      waiting.decodes.insert(at, r);
    }
    begin_waiting(waiting, r, states[r], 0);
  }

  void select_batch(Instance& instance, std::vector<RequestState>& states) override {
    const InstanceConfig& limits = config_.instance;
    WaitQueue& waiting = instance.waiting;
    std::vector<int> old_batch;
    old_batch.swap(instance.batch);
    selected_.clear();
    selected_stamp_.resize(requests_.size(), 0);
    ++stamp_;
    batch_tokens_ = 0;
    new_kv_bytes_ = 0;
    int selected_prompts = 0;

    // Tries to add request r's task; false means "stop scanning this list".
    auto try_add = [&](int r, bool check_memory) {
      if (selected_stamp_[r] == stamp_) return true;
      const RequestState& state = states[r];
      const int64_t tokens = state.phase == Phase::Prompt ? requests_[r].prompt_tokens : 1;
      if (static_cast<int>(selected_.size()) + 1 > limits.max_batch_size) return false;
      if (!selected_.empty() && batch_tokens_ + tokens > limits.max_batch_tokens) return false;
      int64_t kv = 0;
      if (!state.task_started) kv = task_kv_bytes(config_.model, requests_[r], state.phase);
      if (check_memory && instance.memory_bytes + new_kv_bytes_ + kv > instance.max_memory_bytes) return false;
      selected_.push_back(r);
      selected_stamp_[r] = stamp_;
      batch_tokens_ += tokens;
      new_kv_bytes_ += kv;
      if (state.phase == Phase::Prompt) ++selected_prompts;
      return true;
    };
    auto is_selected = [&](int r) { return selected_stamp_[r] == stamp_; };

    // 1. Waiting tasks by (num_preemptions, arrival), only those at the preemption cap: ascending,
    //    so the scan runs only when the least-aged waiting task has reached the cap.
    if (!waiting.by_age.empty() && waiting.by_age.begin()->age + waiting.formations >= limits.max_preemptions) {
      for (const WaitKey& key : waiting.by_age)
        if (!try_add(key.request, !states[key.request].task_started)) break;
    }
    // 2. Prompts waiting here, in order of arrival at the instance.
    for (int r : waiting.prompts)
      if (!try_add(r, true)) break;
    // 3. Preempted decodes.
    for (int r : waiting.blocked)
      if (!try_add(r, false)) break;
    // 4. Decodes of the previous batch.
    for (int r : old_batch)
      if (states[r].phase == Phase::Decode && !try_add(r, false)) break;
    // 5. Everything else queued here, in request-arrival order: prompts and decodes merged.
    for (size_t p = 0, d = 0; p < waiting.prompts.size() || d < waiting.decodes.size();) {
      const bool take_prompt =
          d == waiting.decodes.size() ||
          (p < waiting.prompts.size() &&
           std::pair(requests_[waiting.prompts[p]].arrival_s, states[waiting.prompts[p]].wait_key.sequence) <
               std::pair(requests_[waiting.decodes[d]].arrival_s, states[waiting.decodes[d]].wait_key.sequence));
      if (!try_add(take_prompt ? waiting.prompts[p++] : waiting.decodes[d++], true)) break;
    }

    // Selected waiting tasks stop waiting; the rest age by one (waiting.formations).
    for (int r : selected_)
      if (states[r].waiting) end_waiting(waiting, states[r]);
    int removed_prompts = 0;
    while (!waiting.prompts.empty() && is_selected(waiting.prompts.front())) {
      waiting.prompts.pop_front();
      ++removed_prompts;
    }
    // Scans 2 and 5 take a prefix of the prompts; only scan 1 can take one from further back.
    if (removed_prompts < selected_prompts) std::erase_if(waiting.prompts, is_selected);
    std::erase_if(waiting.decodes, is_selected);
    std::erase_if(waiting.blocked, is_selected);
    ++waiting.formations;
    // Decodes of the old batch left out are preempted (keep their KV) and start aging next time.
    for (int r : old_batch) {
      if (states[r].phase != Phase::Decode || is_selected(r)) continue;
      waiting.blocked.push_back(r);
      begin_waiting(waiting, r, states[r], 1);
    }
    instance.batch = selected_;
  }

 private:
  void begin_waiting(WaitQueue& waiting, int r, RequestState& state, int group) {
    state.waiting = true;
    state.wait_key = WaitKey{state.num_preemptions - waiting.formations, requests_[r].arrival_s, group,
                             next_sequence_++, r};
    waiting.by_age.insert(state.wait_key);
  }

  void end_waiting(WaitQueue& waiting, RequestState& state) {
    state.waiting = false;
    state.num_preemptions = state.wait_key.age + waiting.formations;
    waiting.by_age.erase(state.wait_key);
  }

  const ClusterConfig& config_;
  const std::vector<Request>& requests_;
  std::vector<int> selected_;
  std::vector<uint64_t> selected_stamp_;  // per request: equals stamp_ when in this selection
  uint64_t stamp_ = 0;
  uint64_t next_sequence_ = 0;
  int64_t batch_tokens_ = 0;
  int64_t new_kv_bytes_ = 0;
};

}  // namespace

std::unique_ptr<ClusterScheduler> make_cluster_scheduler(const ClusterConfig& config) {
  switch (config.scheduler.kind) {
    case SchedulerKind::TokenJsq: return std::make_unique<TokenJsqScheduler>();
    case SchedulerKind::MixedPool: return std::make_unique<MixedPoolScheduler>(config);
  }
  fail("cluster config '{}': unknown scheduler kind", config.name);
}

std::unique_ptr<MachineScheduler> make_machine_scheduler(const ClusterConfig& config,
                                                         const std::vector<Request>& requests) {
  return std::make_unique<SplitwiseMachineScheduler>(config, requests);
}

}  // namespace splitflow::sim
