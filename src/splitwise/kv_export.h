// splitwise/kv_export.h — the prompt instance's side of a transfer: each request a token instance
// sends (TcpKvTransport's handler) becomes a prefill-only engine request over exactly the tokens
// asked for (one greedy token is sampled and dropped: the token instance samples the real one),
// and, as an Engine KvStepObserver, the exporter hands the transport the rows each step computes:
// LayerWise, every layer's rows of every span as the layer finishes (rows the prefix cache supplied
// go with the first chunk); Serialized, every layer's rows once the last chunk is computed.
// A step that never ends (its forward threw) fails the exports it held, and their prefills are
// aborted. Everything but start() runs on the engine's thread; start() posts there.
#pragma once

#include "engine/engine.h"
#include "server/async_engine.h"
#include "splitwise/kv_transfer.h"

#include <chrono>
#include <memory>
#include <unordered_map>
#include <vector>

namespace splitflow::splitwise {

class KvExporter : public KvStepObserver {
 public:
  KvExporter(AsyncEngine& engine, KvCache cache);

  // Any thread (the transport's handler): queues the prefill for `request`; a request the engine
  // refuses (too long, tokens outside the vocabulary, another layout) fails its channel.
  void start(TransferRequest request, std::shared_ptr<KvSendChannel> channel);

  void step_begin(std::span<const KvStepSpan> spans) override;
  void layer_done(int32_t layer) override;
  void step_end() override;

  // Prefill tokens of exports not finished yet (any thread).
  int64_t pending_tokens() const { return pending_tokens_.load(); }

 private:
  struct Export {
    std::shared_ptr<KvSendChannel> channel;
    TransferMode mode = TransferMode::LayerWise;
    int32_t num_tokens = 0;
    std::vector<int32_t> sent;  // (layers) rows of each layer handed to the channel
  };
  void send_layer(Export& state, const KvStepSpan& span, int32_t layer, int32_t end);

  AsyncEngine& engine_;
  const KvCache cache_;
  std::atomic<int64_t> pending_tokens_{0};
  // The engine thread's own.
  std::unordered_map<int64_t, Export> exports_;  // by engine request id
  std::vector<KvStepSpan> step_spans_;           // this step's spans of exports
  bool in_step_ = false;
};

}  // namespace splitflow::splitwise
