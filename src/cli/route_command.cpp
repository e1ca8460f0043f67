// `splitflow route`: the Splitwise router (router/router.h) in front of prompt, token and mixed
// `splitflow serve` instances. SIGINT / SIGTERM drain: new requests get 503, in-flight ones finish.
#include "cli/commands.h"
#include "core/error.h"
#include "router/router.h"
#include "splitwise/kv_transfer.h"

#include <fmt/format.h>
#include <pthread.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <memory>
#include <thread>

namespace splitflow::cli {

namespace {

struct RouteFlags {
  router::RouterConfig config;
  double health_interval_s = 1, upstream_timeout_s = 120, drain_timeout_s = 30;
};

void run_route(RouteFlags flags) {
  router::RouterConfig& config = flags.config;
  SF_CHECK(flags.health_interval_s > 0 && flags.upstream_timeout_s > 0 && flags.drain_timeout_s >= 0,
           "route: --health-interval and --upstream-timeout must be positive, --drain-timeout not negative");
  if (!config.kv_transfer.empty()) {
    config.kv_transfer = std::string(splitwise::transfer_mode_name(splitwise::parse_transfer_mode(config.kv_transfer)));
  }
  config.health_interval = std::chrono::milliseconds(static_cast<int64_t>(flags.health_interval_s * 1000));
  config.upstream_timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.upstream_timeout_s * 1000));

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  router::Router router(config);
  const int port = router.bind();
  fmt::print(stderr,
             "splitflow route: on http://{}:{}: {} prompt, {} token, {} mixed instances; prompt instances take at "
             "most {} pending tokens before the mixed pool does; {} attempts per request\n",
             config.host, port, config.prompt_urls.size(), config.token_urls.size(), config.mixed_urls.size(),
             config.scheduler.prompt_max_pending_tokens, config.max_attempts);
  std::atomic<bool> served{false};
  std::thread signal_waiter([&] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    if (served) return;
    fmt::print(stderr, "splitflow route: {} received, draining\n", strsignal(signal));
    router.shutdown(std::chrono::milliseconds(static_cast<int64_t>(flags.drain_timeout_s * 1000)));
  });
  router.serve();
  served = true;
  pthread_kill(signal_waiter.native_handle(), SIGTERM);
  signal_waiter.join();
  fmt::print(stderr, "splitflow route: stopped\n");
}

}  // namespace

void register_route(CLI::App& app) {
  auto flags = std::make_shared<RouteFlags>();
  router::RouterConfig& config = flags->config;
  auto* command = app.add_subcommand(
      "route", "Splitwise router: OpenAI-compatible front over prompt, token and mixed `splitflow serve` instances");
  command->add_option("--prompt", config.prompt_urls, "prompt instances (serve --role prompt), http://host:port");
  command->add_option("--token", config.token_urls, "token instances (serve --role token), http://host:port");
  command->add_option("--mixed", config.mixed_urls, "mixed instances (serve --role mixed), http://host:port");
  command->add_option("--host", config.host, "address to listen on")->capture_default_str();
  command->add_option("--port", config.port, "port to listen on (0: any free port)")->capture_default_str();
  command->add_option("--prompt-max-pending-tokens", config.scheduler.prompt_max_pending_tokens,
                      "pending prompt tokens past which a prompt instance is overloaded and the mixed pool takes "
                      "new prompts")
      ->capture_default_str();
  command->add_option("--kv-transfer", config.kv_transfer,
                      "KV transfer asked of every split request: layerwise or serialized (default: each token "
                      "instance's --kv-transfer)");
  command->add_option("--max-attempts", config.max_attempts, "placements per request, failovers included")
      ->capture_default_str();
  command->add_option("--health-interval", flags->health_interval_s, "seconds between instance health checks")
      ->capture_default_str();
  command->add_option("--upstream-timeout", flags->upstream_timeout_s,
                      "seconds an instance's stream may stay silent before the request moves elsewhere")
      ->capture_default_str();
  command->add_option("--drain-timeout", flags->drain_timeout_s, "seconds in-flight requests get on shutdown")
      ->capture_default_str();
  command->add_option("--served-model-name", config.served_model_name, "the model name /v1/models reports");
  command->callback([flags] { run_route(*flags); });
}

}  // namespace splitflow::cli
