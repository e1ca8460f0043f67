// POST /v1/embeddings end to end over real sockets: the tiny BERT fixture (token-id inputs; it
// has no tokenizer) served through the AsyncEmbedder, its answers equal to the EmbeddingEngine's
// own, in float and base64; OpenAI's input shapes and errors; the generative routes answer 400 on
// an embedding model and /v1/embeddings answers 400 on a generative one.
#include "embedding/embedding_engine.h"
#include "formats/weight_source.h"
#include "model/config.h"
#include "server/embeddings_api.h"
#include "server/http_server.h"

#include "server_test_util.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

namespace splitflow {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

// The tiny BERT as an embedding model: mean pooling, normalized.
struct EmbeddingModel {
  explicit EmbeddingModel(bool matryoshka = false) {
    const std::string dir = test::fixture_path("encoder/tiny_bert");
    spec = resolve_hf_spec(dir);
    spec.embedding.pooling = Pooling::Mean;
    spec.embedding.normalize = true;
    spec.embedding.matryoshka = matryoshka;
    backend = make_cpu_backend(1);
    const EmbeddingEngineConfig config{64, 4};
    runner = std::make_unique<ModelRunner>(spec, bind_weights(spec, *open_weights(dir), DType::F32), *backend,
                                           KvCacheConfig{embedding_cache_blocks(config, 16), 16}, RunnerLimits{64, 4});
    embeddings = std::make_unique<EmbeddingEngine>(*runner, config);
    SchedulerConfig scheduler;
    scheduler.max_batch_tokens = 64;
    scheduler.max_seqs = 4;
    scheduler.num_blocks = runner->kv_config().num_blocks;
    scheduler.block_size = 16;
    scheduler.max_model_len = 64;
    engine = std::make_unique<Engine>(*runner, nullptr, scheduler);
  }
  ModelSpec spec;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<EmbeddingEngine> embeddings;
  std::unique_ptr<Engine> engine;
};

class EmbeddingServer {
 public:
  explicit EmbeddingServer(bool matryoshka = false)
      : model_(matryoshka), async_(*model_.engine, AsyncEngineConfig{}), embedder_(*model_.embeddings, 64) {
    HttpServerConfig config;
    config.port = 0;
    config.served_model_name = "tiny-bert";
    server_ = std::make_unique<HttpServer>(async_, nullptr, std::nullopt, config, &embedder_);
    port_ = server_->bind();
    async_.start();
    embedder_.start();
    thread_ = std::thread([this] { server_->serve(); });
  }
  ~EmbeddingServer() {
    server_->shutdown(100ms);
    thread_.join();
    embedder_.stop();
    async_.stop();
  }
  httplib::Result post(const std::string& path, const std::string& body) const {
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(30, 0);
    return client.Post(path.c_str(), body, "application/json");
  }
  // The engine's own embeddings of these inputs, on a second runner of the same model.
  std::vector<std::vector<float>> reference(const std::vector<std::vector<int32_t>>& inputs) const {
    EmbeddingModel other;
    return other.embeddings->embed(inputs);
  }

  EmbeddingModel model_;
  AsyncEngine async_;
  AsyncEmbedder embedder_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
  std::thread thread_;
};

void expect_status(const httplib::Result& res, int status, const std::string& param) {
  ASSERT_TRUE(res) << "no response";
  EXPECT_EQ(res->status, status) << res->body;
  const json body = json::parse(res->body);
  ASSERT_TRUE(body.contains("error")) << res->body;
  if (!param.empty()) {
    EXPECT_EQ(body["error"]["param"], param) << res->body;
  }
}

TEST(EmbeddingsHttp, AnswersLikeTheEngineInFloatAndBase64) {
  const EmbeddingServer server;
  const std::vector<std::vector<int32_t>> inputs = {{5, 9, 3}, {7}, {11, 12, 13, 14, 15, 16, 17, 18}};
  const auto reference = server.reference(inputs);

  const auto res = server.post("/v1/embeddings", json{{"model", "tiny-bert"}, {"input", inputs}}.dump());
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json body = json::parse(res->body);
  EXPECT_EQ(body["object"], "list");
  EXPECT_EQ(body["model"], "tiny-bert");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 12);
  EXPECT_EQ(body["usage"]["total_tokens"], 12);
  ASSERT_EQ(body["data"].size(), 3u);
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ(body["data"][i]["object"], "embedding");
    EXPECT_EQ(body["data"][i]["index"], i);
    const auto values = body["data"][i]["embedding"].get<std::vector<float>>();
    ASSERT_EQ(values.size(), 32u);
    for (size_t d = 0; d < values.size(); ++d) EXPECT_NEAR(values[d], reference[i][d], 1e-6) << i << " " << d;
  }

  // One list of token ids is one input; base64 carries the same float32 bytes (the reference
  // alone in its forward too: a different batch may round the GEMMs differently).
  const auto alone = server.reference({inputs[0]});
  const auto b64 = server.post("/v1/embeddings", json{{"input", inputs[0]}, {"encoding_format", "base64"}}.dump());
  ASSERT_TRUE(b64);
  ASSERT_EQ(b64->status, 200) << b64->body;
  const json b64_body = json::parse(b64->body);
  ASSERT_EQ(b64_body["data"].size(), 1u);
  EXPECT_EQ(b64_body["data"][0]["embedding"], base64_embedding(alone[0]));
}

TEST(EmbeddingsHttp, RefusesBadInputsAndGenerativeRoutes) {
  const EmbeddingServer server;
  expect_status(server.post("/v1/embeddings", R"({"input": []})"), 400, "input");
  expect_status(server.post("/v1/embeddings", R"({"input": ""})"), 400, "input");
  expect_status(server.post("/v1/embeddings", R"({"input": [[1, 2], [-1]]})"), 400, "input[1]");
  expect_status(server.post("/v1/embeddings", R"({"input": [[1, 2], [96]]})"), 400, "input");  // outside the vocabulary
  expect_status(server.post("/v1/embeddings", R"({"input": 5})"), 400, "input");
  expect_status(server.post("/v1/embeddings", R"({"input": "text"})"), 400, "input");  // no tokenizer
  expect_status(server.post("/v1/embeddings", R"({"input": [1], "encoding_format": "int8"})"), 400, "encoding_format");
  expect_status(server.post("/v1/embeddings", R"({"input": [1], "dimensions": 8})"), 400, "dimensions");  // not Matryoshka
  expect_status(server.post("/v1/embeddings", R"({"input": [1], "model": "other"})"), 404, "model");
  expect_status(server.post("/v1/embeddings", json{{"input", std::vector<int32_t>(65, 3)}}.dump()), 400, "input");
  expect_status(server.post("/v1/completions", R"({"prompt": [1, 2]})"), 400, "model");
  // /metrics counts the embedding requests answered (the refused ones never reached the engine).
  ASSERT_EQ(server.post("/v1/embeddings", R"({"input": [[1, 2], [3]]})")->status, 200);
  httplib::Client client("127.0.0.1", server.port_);
  const auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("splitflow_embedding_requests_total 1"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("splitflow_embedding_tokens_total 3"), std::string::npos) << metrics->body;
  expect_status(server.post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}]})"), 400, "model");
}

// A Matryoshka model's `dimensions`: the first d values of the full vector, renormalized.
TEST(EmbeddingsHttp, DimensionsTruncateAndRenormalize) {
  const EmbeddingServer server(/*matryoshka=*/true);
  const auto full = server.post("/v1/embeddings", R"({"input": [5, 9, 3]})");
  const auto short_one = server.post("/v1/embeddings", R"({"input": [5, 9, 3], "dimensions": 8})");
  ASSERT_TRUE(full && short_one);
  ASSERT_EQ(short_one->status, 200) << short_one->body;
  const auto whole = json::parse(full->body)["data"][0]["embedding"].get<std::vector<float>>();
  const auto part = json::parse(short_one->body)["data"][0]["embedding"].get<std::vector<float>>();
  ASSERT_EQ(part.size(), 8u);
  double norm = 0;
  for (int i = 0; i < 8; ++i) norm += static_cast<double>(whole[i]) * whole[i];
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(part[i], whole[i] / std::sqrt(norm), 1e-6);
  expect_status(server.post("/v1/embeddings", R"({"input": [5], "dimensions": 33})"), 400, "dimensions");
}

TEST(EmbeddingsHttp, GenerativeModelRefusesEmbeddings) {
  test::StoriesEngine stories;
  AsyncEngine async(*stories.engine, AsyncEngineConfig{});
  HttpServerConfig config;
  config.port = 0;
  HttpServer server(async, stories.tokenizer.get(), std::nullopt, config);
  const int port = server.bind();
  async.start();
  std::thread thread([&] { server.serve(); });
  httplib::Client client("127.0.0.1", port);
  expect_status(client.Post("/v1/embeddings", R"({"input": "Once upon a time"})", "application/json"), 400, "model");
  server.shutdown(100ms);
  thread.join();
  async.stop();
}

TEST(EmbeddingsApi, ParsesEveryInputShape) {
  EXPECT_EQ(parse_embedding_request(json::parse(R"({"input": "a"})")).inputs.size(), 1u);
  EXPECT_EQ(parse_embedding_request(json::parse(R"({"input": ["a", "b"]})")).inputs.size(), 2u);
  const EmbeddingRequest ids = parse_embedding_request(json::parse(R"({"input": [1, 2, 3]})"));
  ASSERT_EQ(ids.inputs.size(), 1u);
  EXPECT_EQ(std::get<std::vector<int32_t>>(ids.inputs[0]), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse_embedding_request(json::parse(R"({"input": [[1], [2, 3]]})")).inputs.size(), 2u);
  EXPECT_EQ(parse_embedding_request(json::parse(R"({"input": "a", "dimensions": 8})")).dimensions, 8);
  EXPECT_THROW(parse_embedding_request(json::parse(R"({"input": "a", "dimensions": 0})")), ApiError);
  EXPECT_THROW(parse_embedding_request(json::parse(R"({})")), ApiError);
  // base64 of float32 1.0 (0x3f800000, little-endian 00 00 80 3f).
  EXPECT_EQ(base64_embedding({1.0f}), "AACAPw==");
}

TEST(EmbeddingsBody, FloatsRoundTripToFloat32AndTheTextIsJson) {
  // Values of every magnitude (subnormal to large), signs, zeros, and ones whose shortest float32
  // decimal is far shorter than a double's; a quote in the model name; a non-finite value.
  const std::vector<std::vector<float>> embeddings = {
      {0.1f, -0.0f, 0.0f, 1e-40f, -3.4e38f, 123456.789f, 1.0f / 3.0f, -7.5e-6f},
      {std::numeric_limits<float>::infinity(), 2.0f}};
  const std::string text = embeddings_body(embeddings, EmbeddingEncoding::Float, "a \"model\"", 9);
  const json body = json::parse(text);
  EXPECT_EQ(body["object"], "list");
  EXPECT_EQ(body["model"], "a \"model\"");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 9);
  EXPECT_EQ(body["usage"]["total_tokens"], 9);
  ASSERT_EQ(body["data"].size(), 2u);
  for (size_t i = 0; i < embeddings.size(); ++i) {
    EXPECT_EQ(body["data"][i]["object"], "embedding");
    EXPECT_EQ(body["data"][i]["index"], i);
  }
  const json& first = body["data"][0]["embedding"];
  ASSERT_EQ(first.size(), embeddings[0].size());
  for (size_t d = 0; d < embeddings[0].size(); ++d) {
    const float back = static_cast<float>(first[d].get<double>());
    EXPECT_EQ(std::memcmp(&back, &embeddings[0][d], sizeof back), 0) << d << ": " << first[d].dump();
  }
  EXPECT_NE(text.find("[0.1,"), std::string::npos) << text;  // not 0.10000000149011612
  EXPECT_TRUE(body["data"][1]["embedding"][0].is_null());
  EXPECT_EQ(body["data"][1]["embedding"][1], 2.0);
  const json b64 = json::parse(embeddings_body(embeddings, EmbeddingEncoding::Base64, "m", 1));
  EXPECT_EQ(b64["data"][1]["embedding"], base64_embedding(embeddings[1]));
}

}  // namespace
}  // namespace splitflow
