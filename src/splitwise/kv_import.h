// splitwise/kv_import.h — the token instance's side: the AsyncEngine's KV importer. For each
// reservation it asks the prompt instance named by the request's kv_source for the KV of every
// token but the last (KvTransport::fetch) and ends the import with AsyncEngine::finish_import (the
// rows re-blocked into the reservation on the engine thread) or fail_import (the request ends with
// a "kv_transfer_failed" error, its blocks freed; the router retries it elsewhere).
#pragma once

#include "server/async_engine.h"
#include "splitwise/kv_transfer.h"

#include <string>

namespace splitflow::splitwise {

// kv_source as a request carries it: "host:port", or "layerwise@host:port" / "serialized@host:port".
struct KvSource {
  std::optional<TransferMode> mode;
  std::string address;
};
KvSource parse_kv_source(const std::string& source);  // throws Error naming the expected form

// default_mode: the mode when the source names none (serve's --kv-transfer).
KvImportStarter make_kv_importer(AsyncEngine& engine, KvTransport& transport, KvCache cache, TransferMode default_mode);

}  // namespace splitflow::splitwise
