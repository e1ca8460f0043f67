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
      const bool overloaded = !instance.queued.empty() &&
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
// docs/simulator.md); a list's scan stops at the first task that does not fit.
class SplitwiseMachineScheduler : public MachineScheduler {
 public:
  SplitwiseMachineScheduler(const ClusterConfig& config, const std::vector<Request>& requests)
      : config_(config), requests_(requests) {}

  void select_batch(Instance& instance, std::vector<RequestState>& states) override {
    const InstanceConfig& limits = config_.instance;
    std::vector<int> old_batch;
    old_batch.swap(instance.batch);
    selected_.clear();
    selected_stamp_.resize(requests_.size(), 0);
    ++stamp_;
    batch_tokens_ = 0;
    new_kv_bytes_ = 0;

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
      return true;
    };

    // 1. Waiting tasks by (num_preemptions, arrival), only those at the preemption cap.
    waiting_.assign(instance.queued.begin(), instance.queued.end());
    waiting_.insert(waiting_.end(), instance.blocked.begin(), instance.blocked.end());
    std::stable_sort(waiting_.begin(), waiting_.end(), [&](int a, int b) {
      if (states[a].num_preemptions != states[b].num_preemptions)
        return states[a].num_preemptions < states[b].num_preemptions;
      return requests_[a].arrival_s < requests_[b].arrival_s;
    });
    for (int r : waiting_) {
      if (states[r].num_preemptions < limits.max_preemptions) break;
      if (!try_add(r, !states[r].task_started)) break;
    }
    // 2. Prompts waiting here, in order of arrival at the instance.
    for (int r : instance.queued)
      if (states[r].phase == Phase::Prompt && !try_add(r, true)) break;
    // 3. Preempted decodes.
    for (int r : instance.blocked)
      if (!try_add(r, false)) break;
    // 4. Decodes of the previous batch.
    for (int r : old_batch)
      if (states[r].phase == Phase::Decode && !try_add(r, false)) break;
    // 5. Everything else waiting here, in request-arrival order.
    waiting_.assign(instance.queued.begin(), instance.queued.end());
    std::stable_sort(waiting_.begin(), waiting_.end(),
                     [&](int a, int b) { return requests_[a].arrival_s < requests_[b].arrival_s; });
    for (int r : waiting_)
      if (!try_add(r, true)) break;

    auto is_selected = [&](int r) { return selected_stamp_[r] == stamp_; };
    // Waiting tasks passed over age; decodes dropped from the old batch become preempted.
    for (int r : instance.queued)
      if (!is_selected(r)) ++states[r].num_preemptions;
    for (int r : instance.blocked)
      if (!is_selected(r)) ++states[r].num_preemptions;
    std::vector<int> still_blocked;
    for (int r : instance.blocked)
      if (!is_selected(r)) still_blocked.push_back(r);
    for (int r : old_batch)
      if (states[r].phase == Phase::Decode && !is_selected(r)) still_blocked.push_back(r);
    instance.blocked = std::move(still_blocked);
    std::erase_if(instance.queued, is_selected);
    instance.batch = selected_;
  }

 private:
  const ClusterConfig& config_;
  const std::vector<Request>& requests_;
  std::vector<int> selected_;
  std::vector<int> waiting_;
  std::vector<uint64_t> selected_stamp_;  // per request: equals stamp_ when in this selection
  uint64_t stamp_ = 0;
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
