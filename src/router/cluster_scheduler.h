// router/cluster_scheduler.h — the Splitwise cluster-level scheduler (reference 003, as the
// simulator's mixed_pool: src/sim/schedulers.cpp) over real instances. Pure CPU logic over the
// router's own bookkeeping: it never does I/O and never blocks. The router owns this folder's
// other half (router.h: the OpenAI front, the upstream streams, failover).
//
// Pools: prompt instances run prefills (their KV goes to the token instance), token instances
// decode, mixed instances run whole requests. A request is placed at arrival:
//  - its prompt on the prompt instance with the fewest pending prompt tokens (join the shortest
//    queue), unless that one is overloaded (it has pending work and the request would take it past
//    prompt_max_pending_tokens) or there is none: then the whole request goes to the mixed pool;
//  - its decode on the token instance holding the fewest KV tokens, unless the request would take
//    it past its KV capacity: then the whole request goes to the mixed pool;
//  - the mixed pool is the mixed instances, else an instance borrowed from the other pool (a token
//    instance prefills for itself; a prompt instance runs the whole request): each runs a whole
//    request as a mixed server would. Among them, the fewest pending tokens.
// Pending tokens are what the router placed and has not seen finish: a prompt's tokens until its
// first token comes back, a decode's KV tokens (prompt + max_tokens) until it ends. Instances that
// failed (a dropped connection, a failed health check) are left out until a health check passes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace splitflow::router {

enum class Pool : uint8_t { Prompt, Token, Mixed };
std::string_view pool_name(Pool pool);

struct InstanceState {
  std::string url;           // http://host:port
  Pool pool = Pool::Mixed;
  bool healthy = false;      // the latest health check (or request) succeeded
  std::string kv_address;    // a prompt-capable instance's KV transfer address ("" : none)
  bool imports_kv = false;   // a token-capable instance
  int64_t kv_capacity_tokens = 0;  // its KV cache, in tokens (from /splitwise/info)
  // The router's bookkeeping.
  int64_t pending_prompt_tokens = 0;
  int64_t kv_tokens = 0;
  int64_t active_requests = 0;
  // Lifetime counts.
  int64_t placed = 0, failed = 0;
};

struct Placement {
  int prompt = -1;  // the instance computing the prompt's KV (-1: `token` runs the whole request)
  int token = -1;   // the instance the request is sent to (decodes, streams); -1: none available
  bool split() const { return prompt >= 0 && prompt != token; }
};

struct ClusterSchedulerConfig {
  int64_t prompt_max_pending_tokens = 8192;  // as the simulator's prompt_max_pending_batch_tokens
};

class ClusterScheduler {
 public:
  ClusterScheduler(std::vector<InstanceState> instances, ClusterSchedulerConfig config);

  // Places a request of prompt_tokens (an estimate) generating at most max_tokens, and books its
  // tokens; exclude: instances not to use (those this request already failed on).
  Placement place(int64_t prompt_tokens, int64_t max_tokens, const std::vector<int>& exclude = {});
  // The request's first token came back: its prompt left the prompt instance's queue.
  void prompt_done(const Placement& placement, int64_t prompt_tokens);
  // The request ended on this placement (finished, failed or moved): its bookkeeping is released.
  void release(const Placement& placement, int64_t prompt_tokens, int64_t max_tokens, bool prompt_pending);

  void set_health(int instance, bool healthy);
  void mark_failed(int instance);  // unhealthy until the next health check passes
  std::vector<InstanceState>& instances() { return instances_; }
  const std::vector<InstanceState>& instances() const { return instances_; }

 private:
  int least_prompt_pending(Pool pool, const std::vector<int>& exclude) const;
  int least_kv(Pool pool, int64_t kv_tokens, const std::vector<int>& exclude) const;
  // The mixed instances, else a token instance, else a prompt one: the fewest pending tokens.
  int mixed_pool(const std::vector<int>& exclude) const;

  std::vector<InstanceState> instances_;
  ClusterSchedulerConfig config_;
};

}  // namespace splitflow::router
