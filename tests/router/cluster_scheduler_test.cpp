// The Splitwise cluster scheduler's placements (router/cluster_scheduler.h): join the shortest
// queue by pending prompt tokens, the token pool by KV tokens within capacity, and the mixed pool
// (or a borrowed instance) when a pool is overloaded, empty or down.
#include "router/cluster_scheduler.h"

#include <gtest/gtest.h>

namespace splitflow::router {
namespace {

InstanceState instance(Pool pool, int64_t capacity = 1000) {
  InstanceState s;
  s.url = "http://x";
  s.pool = pool;
  s.healthy = true;
  s.kv_address = pool == Pool::Token ? "" : "127.0.0.1:1";
  s.imports_kv = pool != Pool::Prompt;
  s.kv_capacity_tokens = capacity;
  return s;
}

TEST(ClusterScheduler, SplitsOverTheShortestQueues) {
  ClusterScheduler scheduler({instance(Pool::Prompt), instance(Pool::Prompt), instance(Pool::Token), instance(Pool::Token)},
                             {.prompt_max_pending_tokens = 1000});
  const Placement a = scheduler.place(100, 10);
  EXPECT_TRUE(a.split());
  EXPECT_EQ(a.prompt, 0);
  EXPECT_EQ(a.token, 2);
  const Placement b = scheduler.place(50, 10);  // instance 0 has 100 pending: 1 is shorter
  EXPECT_EQ(b.prompt, 1);
  EXPECT_EQ(b.token, 3);
  scheduler.prompt_done(a, 100);
  const Placement c = scheduler.place(10, 10);
  EXPECT_EQ(c.prompt, 0);  // its prompt is done: 0 pending against 50
  EXPECT_EQ(c.token, 3);   // 60 KV tokens against 110
  scheduler.release(a, 100, 10, false);
  EXPECT_EQ(scheduler.instances()[2].kv_tokens, 0);
  EXPECT_EQ(scheduler.instances()[2].active_requests, 0);
}

TEST(ClusterScheduler, AnOverloadedPromptPoolGoesToTheMixedPool) {
  ClusterScheduler scheduler({instance(Pool::Prompt), instance(Pool::Token), instance(Pool::Mixed)},
                             {.prompt_max_pending_tokens = 300});
  EXPECT_TRUE(scheduler.place(200, 10).split());
  const Placement overloaded = scheduler.place(200, 10);  // 200 pending + 200 > 300
  EXPECT_FALSE(overloaded.split());
  EXPECT_EQ(overloaded.token, 2);
  EXPECT_EQ(scheduler.instances()[2].pending_prompt_tokens, 200);
}

TEST(ClusterScheduler, WithoutAMixedPoolATokenInstanceIsBorrowed) {
  ClusterScheduler scheduler({instance(Pool::Prompt), instance(Pool::Token)}, {.prompt_max_pending_tokens = 300});
  scheduler.mark_failed(0);
  const Placement p = scheduler.place(50, 10);
  EXPECT_FALSE(p.split());
  EXPECT_EQ(p.token, 1);  // it prefills for itself
  EXPECT_EQ(scheduler.instances()[0].failed, 1);
}

TEST(ClusterScheduler, AFullTokenPoolGoesToTheMixedPoolAndExclusionsHold) {
  ClusterScheduler scheduler({instance(Pool::Prompt), instance(Pool::Token, 100), instance(Pool::Mixed)},
                             {.prompt_max_pending_tokens = 1000});
  EXPECT_TRUE(scheduler.place(50, 40).split());
  const Placement full = scheduler.place(50, 40);  // 90 + 90 > 100 KV tokens
  EXPECT_EQ(full.token, 2);
  EXPECT_FALSE(full.split());
  const Placement excluded = scheduler.place(1, 1, {2});
  EXPECT_EQ(excluded.token, 1);  // the mixed one excluded: the token instance, borrowed whole
  ClusterScheduler empty({instance(Pool::Mixed)}, {});
  EXPECT_EQ(empty.place(1, 1, {0}).token, -1);
}

}  // namespace
}  // namespace splitflow::router
