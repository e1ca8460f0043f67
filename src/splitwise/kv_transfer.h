// splitwise/kv_transfer.h — moving one request's KV cache from a prompt instance to a token
// instance (Splitwise, reference 003; docs/splitwise.md). This folder owns: the transfer's model
// (what a transfer carries, its modes and statistics), the transport interface both instance roles
// program against, its TCP implementation (tcp_kv_transport.h), the rows of a paged cache read and
// written across block sizes (kv_rows.h: re-blocking), the prompt side's exporter (kv_export.h:
// an Engine KvStepObserver) and the transfer metrics. It must never: decide which instance
// serves what (that is router/), touch the Engine outside the engine thread (everything reaches it
// through AsyncEngine::post), write a KV block the engine has not reserved for the transfer, or
// let a failed transfer hold blocks (every failure ends in an abort that frees them, on both sides).
//
// A transfer: the token instance has reserved blocks for a request (Engine::take_kv_reservations)
// and asks the prompt instance the router named to compute the KV of every token but the last
// (fetch()); the prompt instance runs them as a prefill-only engine request and sends each
// layer's rows as the layer finishes (LayerWise) or every layer after the prompt's last chunk
// (Serialized); the token instance re-blocks the rows into its reservation and admits the request,
// whose first step computes the last token and samples. Rows are addressed by (layer, position),
// never by block, so the two pools may use different block sizes.
//
// Transports: TCP between processes (tcp_kv_transport.h, host staging on both sides). The interface
// is shaped for device transports too: send_rows() names rows in the sender's paged cache (a
// transport copies what it needs during the call, or enqueues a device send ordered after the
// layer), and fetch() completes with a write step that runs on the engine thread (TCP: staged
// bytes into the reservation; NCCL recv or CUDA IPC: nothing, the rows were received in place).
#pragma once

#include "backend/backend.h"
#include "core/dtype.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace splitflow::splitwise {

enum class TransferMode : uint8_t {
  LayerWise,   // each layer's rows as the layer finishes, overlapping the prompt's compute
  Serialized,  // every layer once the prompt's last chunk is computed
};
std::string_view transfer_mode_name(TransferMode mode);  // "layerwise", "serialized"
TransferMode parse_transfer_mode(std::string_view name);  // throws Error naming the choices

// What one token's KV is in a cache: both ends must agree (checked when a transfer starts).
struct KvLayout {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  DType dtype = DType::F32;
  // Bytes of one token's K (or V) in one layer.
  int64_t row_bytes() const { return static_cast<int64_t>(num_kv_heads) * head_dim * static_cast<int64_t>(dtype_size(dtype)); }
  bool operator==(const KvLayout&) const = default;
  std::string describe() const;  // "24 layers x 8 kv heads x 64 (f32)"
};

// A paged KV cache ([num_layers, num_blocks, block_size, num_kv_heads, head_dim] for K and V, as
// runtime/model_runner.h lays it out) and the backend that reaches it.
struct KvCache {
  Backend* backend = nullptr;
  DeviceTensor k, v;
  KvLayout layout;
  int32_t num_blocks = 0;
  int32_t block_size = 0;
};

// What the token instance asks for.
struct TransferRequest {
  std::string transfer_id;         // for logs and errors
  std::vector<int32_t> token_ids;  // compute (and send) the KV of exactly these positions
  TransferMode mode = TransferMode::LayerWise;
  KvLayout layout;                 // the receiver's; the sender refuses another
};

// Timings of one transfer, from the prompt instance's clock (ms since it read the request).
struct TransferStats {
  int64_t bytes = 0;            // K and V rows sent
  double first_layer_ms = 0;    // the first layer's rows were ready (queueing + the first chunk's first layer)
  double computed_ms = 0;       // the prompt's last layer was computed
  double sent_ms = 0;           // the last row was written to the transport
  // The part of the transfer the prompt's compute did not hide: sent_ms - computed_ms.
  double visible_ms() const { return sent_ms > computed_ms ? sent_ms - computed_ms : 0.0; }
};

// The prompt instance's end of one transfer. Calls come from the engine thread.
class KvSendChannel {
 public:
  virtual ~KvSendChannel() = default;
  // Rows [first_position, first_position + num_tokens) of `layer`, which live in `cache` at
  // block_table[p / cache.block_size]. The transport takes them during the call (TCP copies them
  // to host memory) and never blocks on the network.
  virtual void send_rows(const KvCache& cache, int32_t layer, int32_t first_position, int32_t num_tokens,
                         std::span<const int32_t> block_table) = 0;
  // Every row was given: the transport sends the end of the transfer with these figures.
  virtual void finish(TransferStats stats) = 0;
  // The transfer cannot complete (the prefill failed): the receiver gets `message`.
  virtual void fail(const std::string& message) = 0;
  // The receiver went away or the transfer timed out: stop computing for it.
  virtual bool closed() const = 0;
};

// Where a token instance's transfer lands.
struct KvTarget {
  std::vector<int32_t> block_table;  // the reservation (Engine::take_kv_reservations)
  int32_t num_cached_tokens = 0;     // rows below this are already in the cache and are not written
};

struct FetchCallbacks {
  // Every row arrived. `write` must run on the engine thread while the reservation is held: it
  // puts the rows into the target's blocks (nothing to do for a transport that received in place).
  std::function<void(std::function<void()> write, TransferStats stats)> done;
  // The transfer failed (connection refused or dropped, the sender's error, a malformed frame, no
  // progress for the idle timeout); nothing was or will be written.
  std::function<void(const std::string& message)> failed;
};

// A prompt instance's handler for a transfer request (called on a transport thread).
using TransferHandler = std::function<void(TransferRequest request, std::shared_ptr<KvSendChannel> channel)>;

class KvTransport {
 public:
  virtual ~KvTransport() = default;
  // Token side: asks the prompt instance at `address` for request's KV, to be written into
  // `target` of `cache`. Exactly one callback runs, on a transport thread, unless cancelled first.
  // Returns the cancel: after it no callback runs and the sender sees the connection close.
  virtual std::function<void()> fetch(const std::string& address, TransferRequest request, const KvCache& cache,
                                      KvTarget target, FetchCallbacks callbacks) = 0;
  // Prompt side: the address token instances reach this one at ("host:port"); empty when not serving.
  virtual std::string address() const = 0;
};

}  // namespace splitflow::splitwise
