#include "router/cluster_scheduler.h"

#include "core/error.h"

#include <algorithm>

namespace splitflow::router {

std::string_view pool_name(Pool pool) {
  switch (pool) {
    case Pool::Prompt: return "prompt";
    case Pool::Token: return "token";
    case Pool::Mixed: return "mixed";
  }
  return "?";
}

ClusterScheduler::ClusterScheduler(std::vector<InstanceState> instances, ClusterSchedulerConfig config)
    : instances_(std::move(instances)), config_(config) {
  SF_CHECK(!instances_.empty(), "router: no instances");
  SF_CHECK(config_.prompt_max_pending_tokens > 0, "router: the prompt pending-token limit must be positive");
}

namespace {
bool excluded(const std::vector<int>& exclude, int i) { return std::find(exclude.begin(), exclude.end(), i) != exclude.end(); }
}  // namespace

int ClusterScheduler::least_prompt_pending(Pool pool, const std::vector<int>& exclude) const {
  int best = -1;
  for (int i = 0; i < static_cast<int>(instances_.size()); ++i) {
    const InstanceState& s = instances_[i];
    if (s.pool != pool || !s.healthy || excluded(exclude, i) || s.kv_address.empty()) continue;
    if (best < 0 || s.pending_prompt_tokens < instances_[best].pending_prompt_tokens) best = i;
  }
  return best;
}

int ClusterScheduler::least_kv(Pool pool, int64_t kv_tokens, const std::vector<int>& exclude) const {
  int best = -1;
  for (int i = 0; i < static_cast<int>(instances_.size()); ++i) {
    const InstanceState& s = instances_[i];
    if (s.pool != pool || !s.healthy || excluded(exclude, i) || !s.imports_kv) continue;
    if (s.kv_capacity_tokens > 0 && s.kv_tokens > 0 && s.kv_tokens + kv_tokens > s.kv_capacity_tokens) continue;
    if (best < 0 || s.kv_tokens < instances_[best].kv_tokens) best = i;
  }
  return best;
}

// Pending tokens of a whole request on an instance: its queued prompts plus one per running decode.
int ClusterScheduler::mixed_pool(const std::vector<int>& exclude) const {
  auto load = [&](const InstanceState& s) { return s.pending_prompt_tokens + s.active_requests; };
  for (const Pool pool : {Pool::Mixed, Pool::Token, Pool::Prompt}) {
    int best = -1;
    for (int i = 0; i < static_cast<int>(instances_.size()); ++i) {
      const InstanceState& s = instances_[i];
      if (s.pool != pool || !s.healthy || excluded(exclude, i)) continue;
      if (best < 0 || load(s) < load(instances_[best])) best = i;
    }
    if (best >= 0) return best;
  }
  return -1;
}

Placement ClusterScheduler::place(int64_t prompt_tokens, int64_t max_tokens, const std::vector<int>& exclude) {
  Placement placement;
  int prompt = least_prompt_pending(Pool::Prompt, exclude);
  if (prompt >= 0) {
    const InstanceState& p = instances_[prompt];
    if (p.pending_prompt_tokens > 0 && p.pending_prompt_tokens + prompt_tokens > config_.prompt_max_pending_tokens)
      prompt = -1;  // overloaded: the mixed pool takes the prompt
  }
  const int token = least_kv(Pool::Token, prompt_tokens + max_tokens, exclude);
  if (prompt >= 0 && token >= 0) {
    placement.prompt = prompt;
    placement.token = token;
  } else {
    placement.token = mixed_pool(exclude);
  }
  if (placement.token < 0) return placement;
  InstanceState& target = instances_[placement.token];
  InstanceState& computes = instances_[placement.split() ? placement.prompt : placement.token];
  computes.pending_prompt_tokens += prompt_tokens;
  target.kv_tokens += prompt_tokens + max_tokens;
  ++target.active_requests;
  ++target.placed;
  if (placement.split()) ++computes.placed;
  return placement;
}

void ClusterScheduler::prompt_done(const Placement& placement, int64_t prompt_tokens) {
  const int computes = placement.split() ? placement.prompt : placement.token;
  if (computes < 0) return;
  instances_[computes].pending_prompt_tokens = std::max<int64_t>(0, instances_[computes].pending_prompt_tokens - prompt_tokens);
}

void ClusterScheduler::release(const Placement& placement, int64_t prompt_tokens, int64_t max_tokens,
                               bool prompt_pending) {
  if (placement.token < 0) return;
  if (prompt_pending) prompt_done(placement, prompt_tokens);
  InstanceState& target = instances_[placement.token];
  target.kv_tokens = std::max<int64_t>(0, target.kv_tokens - (prompt_tokens + max_tokens));
  target.active_requests = std::max<int64_t>(0, target.active_requests - 1);
}

void ClusterScheduler::set_health(int instance, bool healthy) { instances_.at(instance).healthy = healthy; }

void ClusterScheduler::mark_failed(int instance) {
  instances_.at(instance).healthy = false;
  ++instances_.at(instance).failed;
}

}  // namespace splitflow::router
