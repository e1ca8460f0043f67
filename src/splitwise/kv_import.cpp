#include "splitwise/kv_import.h"

#include "core/error.h"

#include <fmt/format.h>

namespace splitflow::splitwise {

KvSource parse_kv_source(const std::string& source) {
  KvSource parsed;
  std::string address = source;
  if (const size_t at = source.find('@'); at != std::string::npos) {
    parsed.mode = parse_transfer_mode(source.substr(0, at));
    address = source.substr(at + 1);
  }
  const size_t colon = address.rfind(':');
  SF_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < address.size() &&
               address.find_first_not_of("0123456789", colon + 1) == std::string::npos,
           "kv_source '{}' is not [layerwise@|serialized@]host:port", source);
  parsed.address = address;
  return parsed;
}

KvImportStarter make_kv_importer(AsyncEngine& engine, KvTransport& transport, KvCache cache, TransferMode default_mode) {
  return [&engine, &transport, cache, default_mode](const KvReservation& reservation, const std::string& source) {
    const KvSource parsed = parse_kv_source(source);
    TransferRequest request;
    request.transfer_id = fmt::format("{}#{}", parsed.address, reservation.request_id);
    request.token_ids = reservation.token_ids;
    request.mode = parsed.mode.value_or(default_mode);
    request.layout = cache.layout;
    const int64_t id = reservation.request_id;
    FetchCallbacks callbacks;
    callbacks.done = [&engine, id](std::function<void()> write, TransferStats) { engine.finish_import(id, std::move(write)); };
    callbacks.failed = [&engine, id](const std::string& message) {
      engine.fail_import(id, fmt::format("kv_transfer_failed: {}", message));
    };
    return transport.fetch(parsed.address, std::move(request), cache,
                           KvTarget{reservation.block_table, reservation.num_cached_tokens}, std::move(callbacks));
  };
}

}  // namespace splitflow::splitwise
