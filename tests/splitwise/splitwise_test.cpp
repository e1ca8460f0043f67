// Splitwise in one process: a prompt instance (AsyncEngine + KvExporter + TcpKvTransport listening)
// and a token instance (AsyncEngine + the KV importer) over real TCP on the loopback, on the real
// stories260K model (CPU backend). References: the same engine running the request alone (greedy
// tokens must be equal), the re-blocked rows read back, the free-block count after failures.
#include "backend/backend.h"
#include "engine/model_loader.h"
#include "server/async_engine.h"
#include "splitwise/kv_export.h"
#include "splitwise/kv_import.h"
#include "splitwise/kv_rows.h"
#include "splitwise/tcp_kv_transport.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <thread>

namespace splitflow::splitwise {
namespace {

using namespace std::chrono_literals;

Backend& backend() {
  static std::unique_ptr<Backend> cpu = make_cpu_backend(0);
  return *cpu;
}

LoadedModel load() {
  ModelLoadOptions options;
  options.model_path = test::shared_path("models/stories260K-hf");
  return load_model(options);
}

// One serving instance: runner, engine, async loop, and its Splitwise half.
struct Instance {
  Instance(int32_t block_size, bool prompt_role, TcpKvConfig kv_config = {}) {
    LoadedModel model = load();
    tokenizer = std::move(model.tokenizer);
    runner = std::make_unique<ModelRunner>(model.spec, std::move(model.weights), backend(),
                                           KvCacheConfig{num_blocks, block_size, 0}, RunnerLimits{64, 8});
    SchedulerConfig config;
    config.max_batch_tokens = 64;  // prompts run in chunks
    config.max_seqs = 8;
    config.num_blocks = num_blocks;
    config.block_size = block_size;
    config.max_model_len = 256;
    engine = std::make_unique<Engine>(*runner, tokenizer.get(), config);
    async = std::make_unique<AsyncEngine>(*engine, AsyncEngineConfig{});
    cache = KvCache{&backend(), runner->k_cache_view(), runner->v_cache_view(),
                    KvLayout{runner->spec().num_layers, runner->spec().attention.num_kv_heads,
                             runner->spec().attention.head_dim, runner->kv_cache_dtype()},
                    num_blocks, block_size};
    TransferHandler handler;
    if (prompt_role) {
      exporter.emplace(*async, cache);
      engine->set_kv_observer(&*exporter);
      handler = [this](TransferRequest request, std::shared_ptr<KvSendChannel> channel) {
        exporter->start(std::move(request), std::move(channel));
      };
      kv_config.port = 0;
    }
    transport = std::make_unique<TcpKvTransport>(kv_config, metrics, handler);
    if (!prompt_role) async->set_kv_importer(make_kv_importer(*async, *transport, cache, TransferMode::LayerWise));
    transport->start();
    async->start();
  }
  ~Instance() {
    async->stop();
    transport->stop();
  }

  static constexpr int32_t num_blocks = 96;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<AsyncEngine> async;
  KvCache cache;
  TransferMetrics metrics;
  std::optional<KvExporter> exporter;
  std::unique_ptr<TcpKvTransport> transport;
};

struct Result {
  std::vector<int32_t> ids;
  std::string text;
  std::string error;
  FinishReason finish = FinishReason::None;
};

Result collect(const std::shared_ptr<RequestStream>& stream) {
  Result result;
  for (int i = 0; i < 3000; ++i) {
    RequestUpdate update;
    if (!stream->next(update, 20ms)) continue;
    for (const TokenOutput& token : update.choices[0].tokens) result.ids.push_back(token.token_id);
    result.text += update.choices[0].text;
    if (update.choices[0].finish_reason != FinishReason::None) result.finish = update.choices[0].finish_reason;
    if (!update.error.empty()) result.error = update.error;
    if (update.finished) return result;
  }
  ADD_FAILURE() << "the request did not end";
  return result;
}

SamplingParams greedy(int32_t max_tokens) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.max_tokens = max_tokens;
  params.ignore_eos = true;
  return params;
}

const std::string kPrompt =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her dog, "
    "and every day they ran to the big tree near the river to look at the birds.";

Result run_split(Instance& prompt, Instance& token, const std::vector<int32_t>& ids, const SamplingParams& params,
                 const std::string& mode, std::vector<int32_t> resume = {}) {
  PromptSubmission submission;
  submission.prompt_ids = ids;
  submission.params = params;
  submission.start.import_kv = true;
  submission.start.prior_output_ids = std::move(resume);
  submission.kv_source = mode + "@" + prompt.transport->address();
  std::vector<PromptSubmission> group;
  group.push_back(std::move(submission));
  return collect(token.async->submit_group(std::move(group), 1).front());
}

int32_t free_blocks(Instance& instance) {
  // Read on the loop thread: the block manager is the engine's.
  std::promise<int32_t> free;
  instance.async->post([&](Engine& engine) { free.set_value(engine.scheduler().block_manager().num_free_blocks()); });
  return free.get_future().get();
}

TEST(KvRows, ReblockingBetweenBlockSizesKeepsEveryRow) {
  const KvLayout layout{2, 3, 4, DType::F32};
  auto make = [&](int32_t block_size, int32_t blocks, std::vector<DeviceBuffer>& keep) {
    keep.push_back(backend().allocate(DType::F32, {2, blocks, block_size, 3, 4}));
    keep.push_back(backend().allocate(DType::F32, {2, blocks, block_size, 3, 4}));
    return KvCache{&backend(), keep[keep.size() - 2].view(), keep.back().view(), layout, blocks, block_size};
  };
  std::vector<DeviceBuffer> keep;
  const KvCache a = make(16, 4, keep), b = make(5, 12, keep);
  const std::vector<int32_t> table_a = {3, 0, 2}, table_b = {7, 1, 11, 4, 0, 9, 2};
  const int32_t n = 33;
  std::vector<float> k(n * 12), v(n * 12), k2(n * 12), v2(n * 12);
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(i), v[i] = -static_cast<float>(i);
  for (int32_t layer = 0; layer < 2; ++layer) {
    write_rows(a, layer, 0, n, table_a, reinterpret_cast<char*>(k.data()), reinterpret_cast<char*>(v.data()));
    // Across the pools in two pieces, as chunks would come.
    std::vector<float> kt(n * 12), vt(n * 12);
    read_rows(a, layer, 0, 20, table_a, reinterpret_cast<char*>(kt.data()), reinterpret_cast<char*>(vt.data()));
    read_rows(a, layer, 20, 13, table_a, reinterpret_cast<char*>(kt.data() + 20 * 12), reinterpret_cast<char*>(vt.data() + 20 * 12));
    write_rows(b, layer, 0, n, table_b, reinterpret_cast<char*>(kt.data()), reinterpret_cast<char*>(vt.data()));
    read_rows(b, layer, 0, n, table_b, reinterpret_cast<char*>(k2.data()), reinterpret_cast<char*>(v2.data()));
    EXPECT_EQ(k2, k);
    EXPECT_EQ(v2, v);
  }
  EXPECT_THROW(read_rows(a, 0, 40, 10, table_a, reinterpret_cast<char*>(k2.data()), reinterpret_cast<char*>(v2.data())), Error);
  EXPECT_THROW(read_rows(a, 2, 0, 1, table_a, reinterpret_cast<char*>(k2.data()), reinterpret_cast<char*>(v2.data())), Error);
  const std::vector<int32_t> bad = {9};
  EXPECT_THROW(read_rows(a, 0, 0, 1, bad, reinterpret_cast<char*>(k2.data()), reinterpret_cast<char*>(v2.data())), Error);
}

TEST(Splitwise, PromptPlusTokenEqualsOneInstanceInBothModesAndAcrossBlockSizes) {
  Instance prompt(16, true);
  Instance token(8, false);   // another block size: the rows are re-blocked
  Instance mixed(16, false);  // the reference: the request run whole
  const std::vector<int32_t> ids = mixed.tokenizer->encode(kPrompt, true);
  ASSERT_GT(ids.size(), 64u) << "the prompt must take several chunks";
  const Result reference = collect(mixed.async->submit(ids, greedy(24), 1));
  ASSERT_EQ(reference.ids.size(), 24u);
  for (const std::string mode : {"layerwise", "serialized"}) {
    const Result split = run_split(prompt, token, ids, greedy(24), mode);
    EXPECT_EQ(split.error, "");
    EXPECT_EQ(split.ids, reference.ids) << mode;
    EXPECT_EQ(split.text, reference.text) << mode;
  }
  // The prompt side counts a transfer once it reads the receiver's Ack, just after the request runs.
  for (int i = 0; i < 100 && prompt.metrics.to_json()["sent"] != 2; ++i) std::this_thread::sleep_for(10ms);
  const nlohmann::json sent = prompt.metrics.to_json(), received = token.metrics.to_json();
  EXPECT_EQ(sent["sent"], 2);
  EXPECT_EQ(received["received"], 2);
  // Every token but the last, K and V, every layer.
  const int64_t bytes = 2 * static_cast<int64_t>(ids.size() - 1) * prompt.cache.layout.row_bytes() * prompt.cache.layout.num_layers;
  EXPECT_EQ(received["received_bytes"], 2 * bytes);
  EXPECT_EQ(sent["sent_bytes"], 2 * bytes);
  EXPECT_EQ(received["staged_bytes"], 0);
  std::printf("transfer of %zu tokens (%lld bytes): prompt compute %.2f ms, visible %.3f ms, fetch %.2f ms\n",
              ids.size() - 1, static_cast<long long>(bytes), sent["last_prompt_compute_ms"].get<double>(),
              sent["last_visible_ms"].get<double>(), received["last_fetch_ms"].get<double>());
  EXPECT_EQ(free_blocks(token), Instance::num_blocks);
}

TEST(Splitwise, AResumedRequestContinuesTheStream) {
  Instance prompt(16, true);
  Instance token(16, false);
  const std::vector<int32_t> ids = token.tokenizer->encode("Tom had a big red ball. He", true);
  const Result whole = collect(token.async->submit(ids, greedy(20), 1));
  ASSERT_EQ(whole.ids.size(), 20u);
  const std::vector<int32_t> streamed(whole.ids.begin(), whole.ids.begin() + 7);
  // Recomputed where it lands (no KV source) and with its KV (prompt + streamed tokens) imported.
  PromptSubmission local;
  local.prompt_ids = ids;
  local.params = greedy(20);
  local.start.prior_output_ids = streamed;
  std::vector<PromptSubmission> group;
  group.push_back(local);
  const Result resumed = collect(token.async->submit_group(std::move(group), 1).front());
  const Result imported = run_split(prompt, token, ids, greedy(20), "layerwise", streamed);
  const std::vector<int32_t> rest(whole.ids.begin() + 7, whole.ids.end());
  EXPECT_EQ(resumed.ids, rest);
  EXPECT_EQ(imported.ids, rest);
  // The text continues exactly where the streamed tokens' text ended.
  std::string head;
  {
    StreamDecoder decoder(*token.tokenizer, true);
    for (int32_t id : streamed) head += decoder.push(id);
  }
  EXPECT_EQ(head + resumed.text, whole.text);
}

TEST(Splitwise, MalformedTransfersAreRefusedAndTheInstanceGoesOn) {
  Instance prompt(16, true);
  Instance token(16, false);
  const std::string address = prompt.transport->address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  auto send_raw = [&](const std::string& bytes) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    char buffer[4096];
    const ssize_t got = ::read(fd, buffer, sizeof buffer);  // the Error frame, then the close
    EXPECT_GT(got, 16) << "the prompt instance answers with an Error frame";
    if (got > 16) EXPECT_NE(std::string(buffer + 16, static_cast<size_t>(got - 16)).find("malformed"), std::string::npos);
    ::close(fd);
  };
  send_raw(std::string(16, 'x'));  // not a frame
  std::string header(16, '\0');
  const uint32_t magic = 0x564B4653;
  std::memcpy(header.data(), &magic, 4);
  header[4] = 1;  // Request
  const uint64_t length = 9;
  std::memcpy(header.data() + 8, &length, 8);
  send_raw(header + "{\"oops\":1");  // truncated JSON
  // An unknown address fails the request cleanly, its blocks freed.
  const std::vector<int32_t> ids = token.tokenizer->encode(kPrompt, true);
  PromptSubmission bad;
  bad.prompt_ids = ids;
  bad.params = greedy(4);
  bad.start.import_kv = true;
  bad.kv_source = "127.0.0.1:1";
  std::vector<PromptSubmission> group;
  group.push_back(bad);
  const Result refused = collect(token.async->submit_group(std::move(group), 1).front());
  EXPECT_NE(refused.error.find("kv_transfer_failed"), std::string::npos) << refused.error;
  EXPECT_EQ(refused.finish, FinishReason::Abort);
  EXPECT_EQ(free_blocks(token), Instance::num_blocks);
  // And a real transfer still works.
  const Result good = run_split(prompt, token, ids, greedy(4), "layerwise");
  EXPECT_EQ(good.error, "");
  EXPECT_EQ(good.ids.size(), 4u);
  EXPECT_GE(prompt.metrics.to_json()["send_failed"].get<int64_t>(), 2);
}

TEST(Splitwise, AStalledTransferTimesOutAndFreesBlocksOnBothSides) {
  TcpKvConfig slow;
  slow.debug_rows_delay = 300ms;  // the link stalls for longer than the receiver waits
  Instance prompt(16, true, slow);
  TcpKvConfig impatient;
  impatient.idle_timeout = 100ms;
  Instance token(16, false, impatient);
  const std::vector<int32_t> ids = token.tokenizer->encode(kPrompt, true);
  const Result stalled = run_split(prompt, token, ids, greedy(4), "layerwise");
  EXPECT_NE(stalled.error.find("stalled"), std::string::npos) << stalled.error;
  EXPECT_TRUE(stalled.ids.empty());
  EXPECT_EQ(free_blocks(token), Instance::num_blocks);
  EXPECT_EQ(token.metrics.to_json()["receive_timeouts"], 1);
  EXPECT_EQ(token.metrics.to_json()["staged_bytes"], 0);
  // The sender sees the receiver go and drops what it staged.
  for (int i = 0; i < 100 && prompt.metrics.to_json()["staged_bytes"] != 0; ++i) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(prompt.metrics.to_json()["staged_bytes"], 0);
  EXPECT_EQ(prompt.metrics.to_json()["send_failed"], 1);
  // Its prefill ends (or is aborted) within a step or two.
  int32_t prompt_free = 0;
  for (int i = 0; i < 100 && (prompt_free = free_blocks(prompt)) != Instance::num_blocks; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(prompt_free, Instance::num_blocks);
}

}  // namespace
}  // namespace splitflow::splitwise
