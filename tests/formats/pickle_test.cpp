// PyTorch checkpoints through the restricted unpickler (formats/pickle.h). Fixtures come from
// python/make_pickle_fixtures.py: every layout torch.save writes, compared with what
// torch.load(weights_only=True) read from the same files (expected/*.safetensors, written by the
// safetensors package); malicious pickles whose payloads the generator proved live; truncated and
// byte-flipped files; and stories260K-hf converted to pytorch_model.bin at test time, whose logits
// must equal those of its safetensors original.
#include "formats/pickle.h"

#include "backend/backend.h"
#include "core/mapped_file.h"
#include "format_test_util.h"
#include "formats/weight_source.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/model_runner.h"
#include "splitflow_command.h"
#include "test_paths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <random>

namespace splitflow {
namespace {

using namespace test;
using namespace std::string_literals;
using nlohmann::json;
namespace fs = std::filesystem;

std::string pickle_fixture(const std::string& name) { return fixture_path("pickle/" + name); }

// Same names in the same order, dtypes, shapes and bytes.
void expect_same_tensors(const WeightSource& actual, const WeightSource& expected, const std::string& what) {
  ASSERT_EQ(actual.tensors().size(), expected.tensors().size()) << what;
  for (const TensorInfo& want : expected.tensors()) {
    const TensorInfo* got = actual.find(want.name);
    ASSERT_NE(got, nullptr) << what << ": no tensor '" << want.name << "'";
    EXPECT_EQ(got->tensor.dtype, want.tensor.dtype) << what << ": " << want.name;
    ASSERT_EQ(got->tensor.shape, want.tensor.shape) << what << ": " << want.name;
    ASSERT_EQ(got->tensor.nbytes(), want.tensor.nbytes()) << what << ": " << want.name;
    if (want.tensor.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(got->tensor.data, want.tensor.data, want.tensor.nbytes()), 0)
          << what << ": values of '" << want.name << "' differ from torch.load's";
    }
  }
}

// ---- every layout against torch.load ------------------------------------------------------------

class PickleLayout : public ::testing::TestWithParam<std::string> {};

TEST_P(PickleLayout, SameTensorsAsTorchLoad) {
  const std::string name = GetParam();
  const auto source = open_pytorch(pickle_fixture(name + ".pt"));
  EXPECT_EQ(source->format(), "pytorch");
  expect_same_tensors(*source, *open_safetensors(pickle_fixture("expected/" + name + ".safetensors")), name);

  const json expected = read_json_file(pickle_fixture("expected/" + name + ".json"));
  std::vector<std::string> order;
  for (const TensorInfo& info : source->tensors()) order.push_back(info.name);
  EXPECT_EQ(order, expected.at("tensors").get<std::vector<std::string>>()) << "tensors keep the checkpoint's order";
  EXPECT_EQ(source->metadata(), expected.at("metadata"));
}

INSTANTIATE_TEST_SUITE_P(Torch, PickleLayout, ::testing::Values("zip", "zip_protocol5", "legacy", "nested"));

TEST(Pickle, ShardedIndexLoadsEveryShard) {
  const auto expected = open_safetensors(pickle_fixture("expected/sharded.safetensors"));
  const auto by_index = open_pytorch_index(pickle_fixture("sharded/pytorch_model.bin.index.json"));
  expect_same_tensors(*by_index, *expected, "index");
  EXPECT_EQ(by_index->metadata().at("total_size").get<int64_t>() > 0, true);
  const auto by_directory = open_weights(pickle_fixture("sharded"));
  EXPECT_EQ(by_directory->format(), "pytorch");
  expect_same_tensors(*by_directory, *expected, "directory");
}

TEST(Pickle, ShardedIndexNamingAMissingTensorFails) {
  TempDir dir;
  for (const auto& entry : fs::directory_iterator(pickle_fixture("sharded")))
    fs::copy_file(entry.path(), dir.path() / entry.path().filename());
  json index = read_json_file(pickle_fixture("sharded/pytorch_model.bin.index.json"));
  index["weight_map"]["not_there"] = "pytorch_model-00001-of-00002.bin";
  write_bytes(dir.file("pytorch_model.bin.index.json"), index.dump());
  expect_error([&] { open_weights(dir.path().string()); }, {"not_there", "no such tensor"});
  index["weight_map"]["not_there"] = "absent.bin";
  write_bytes(dir.file("pytorch_model.bin.index.json"), index.dump());
  expect_error([&] { open_weights(dir.path().string()); }, {"absent.bin", "cannot open"});
}

TEST(Pickle, ZipTensorsAreViewsIntoTheMappingAndShareStorages) {
  const auto source = open_pytorch(pickle_fixture("zip.pt"));
  const auto data = [&](const char* name) { return static_cast<const uint8_t*>(source->find(name)->tensor.data); };
  // torch.save aligns every storage to 64 bytes, so the f32 tensors are views, not copies.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(data("base")) % 64, 0u);
  EXPECT_EQ(data("rows_1_to_3"), data("base") + 5 * sizeof(float)) << "a storage_offset view into base's bytes";
  const Tensor& last_column = source->find("last_column")->tensor;  // base[:, 4]: stride 5, materialized
  for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(last_column.as<float>()[r], source->find("base")->tensor.as<float>()[r * 5 + 4]);
}

TEST(Pickle, StridedViewsAreMaterializedContiguous) {
  const auto source = open_pytorch(pickle_fixture("zip.pt"));
  const Tensor& base = source->find("base")->tensor;  // [4, 5]
  const Tensor& transposed = source->find("transposed")->tensor;
  ASSERT_EQ(transposed.shape, (Shape{5, 4}));
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(transposed.as<float>()[r * 4 + c], base.as<float>()[c * 5 + r]);
  EXPECT_EQ(source->find("tied.a")->tensor.data, source->find("tied.b")->tensor.data) << "one storage, one view";
}

TEST(Pickle, OpenWeightsPicksPyTorchByNameAndMagic) {
  TempDir dir;
  EXPECT_EQ(open_weights(pickle_fixture("zip.pt"))->format(), "pytorch");
  fs::copy_file(pickle_fixture("zip.pt"), dir.file("weights.bin"));
  fs::copy_file(pickle_fixture("legacy.pt"), dir.file("legacy.bin"));
  EXPECT_EQ(open_weights(dir.file("weights.bin"))->format(), "pytorch");
  EXPECT_EQ(open_weights(dir.file("legacy.bin"))->format(), "pytorch");
  fs::copy_file(pickle_fixture("zip.pt"), dir.file("pytorch_model.bin"));
  EXPECT_EQ(open_weights(dir.path().string())->format(), "pytorch");
  write_bytes(dir.file("junk.pt"), "not a checkpoint at all");
  expect_error([&] { open_weights(dir.file("junk.pt")); }, {"junk.pt", "not a PyTorch checkpoint"});
}

// ---- malicious pickles --------------------------------------------------------------------------

struct MaliciousCase {
  std::string file, refused, marker;
};

// gtest prints a parameter of a failing case; the file name says which one it was.
void PrintTo(const MaliciousCase& malicious, std::ostream* out) { *out << malicious.file; }

std::vector<MaliciousCase> malicious_cases() {
  std::vector<MaliciousCase> cases;
  const json index = read_json_file(pickle_fixture("malicious/index.json"));
  for (const auto& [file, entry] : index.items())
    cases.push_back({file, entry.at("refused"), entry.at("marker").is_null() ? "" : entry.at("marker").get<std::string>()});
  return cases;
}

class MaliciousPickle : public ::testing::TestWithParam<MaliciousCase> {};

TEST_P(MaliciousPickle, IsRefusedNamingTheGlobalAndRunsNothing) {
  const MaliciousCase& malicious = GetParam();
  if (!malicious.marker.empty()) fs::remove(malicious.marker);
  const std::string path = pickle_fixture("malicious/" + malicious.file);
  expect_error([&] { open_pytorch(path); }, {path, malicious.refused});
  expect_error([&] { open_weights(path); }, {malicious.refused});
  if (!malicious.marker.empty()) {
    EXPECT_FALSE(fs::exists(malicious.marker)) << "the payload ran: " << malicious.marker << " exists";
  }
}

INSTANTIATE_TEST_SUITE_P(Attacks, MaliciousPickle, ::testing::ValuesIn(malicious_cases()), [](const auto& info) {
  std::string name = info.param.file.substr(0, info.param.file.size() - 3);
  return name;
});

TEST(Pickle, EveryLivePayloadHasAMarkerAndNoneWasCreated) {
  int live = 0;
  for (const MaliciousCase& malicious : malicious_cases()) {
    if (malicious.marker.empty()) continue;
    ++live;
    fs::remove(malicious.marker);
    try {
      open_weights(pickle_fixture("malicious/" + malicious.file));
    } catch (const Error&) {
    }
    EXPECT_FALSE(fs::exists(malicious.marker)) << malicious.file;
  }
  EXPECT_GE(live, 8) << "os.system, eval, exec, Popen, nested REDUCE, INST, OBJ, legacy";
}

// ---- hand-made pickles: every check names the problem -------------------------------------------

Pickle unpickle_bytes(std::string_view bytes) {
  return unpickle_restricted(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "test pickle");
}

void expect_refused(std::string_view bytes, std::string_view message) {
  expect_error([&] { unpickle_bytes(bytes); }, {"test pickle", message});
}

// Little helpers spelling opcodes as CPython's Lib/pickle.py names them.
std::string str(std::string_view text) {
  ByteWriter writer;
  writer.raw("X").put<uint32_t>(text.size()).raw(text);
  return writer.bytes;
}
const std::string kProto = std::string("\x80\x02", 2);
const std::string kRebuild = "ctorch._utils\n_rebuild_tensor_v2\n";
const std::string kOrderedDict = "ccollections\nOrderedDict\n)R";
std::string storage_pid(int numel) {
  std::string pid = "(";
  pid += str("storage") + "ctorch\nFloatStorage\n" + str("0") + str("cpu") + "K" + std::string(1, char(numel)) + "tQ";
  return pid;
}
// _rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())
std::string rebuild(int numel, int offset, const std::string& size, const std::string& stride) {
  return kRebuild + "(" + storage_pid(numel) + "K" + std::string(1, char(offset)) + size + stride + "\x89" + kOrderedDict +
         "tR";
}

TEST(Unpickler, PlainValues) {
  const std::string bytes = kProto + "}(" + str("i") + "J\xff\xff\xff\xff" + str("f") + "G\x3f\xf8\0\0\0\0\0\0"s +
                            str("l") + "]q\x01(K\x01K\x02" "eh\x01\x86" + str("n") + "N" + str("big") +
                            "\x8a\x02\x00\x80"s + "u.";
  const Pickle pickle = unpickle_bytes(bytes);
  const PickleObject& root = pickle.at(pickle.root);
  ASSERT_EQ(root.kind, PickleObject::Kind::Dict);
  ASSERT_EQ(root.items.size(), 10u);
  EXPECT_EQ(pickle.at(root.items[1]).integer, -1);
  EXPECT_EQ(pickle.at(root.items[3]).real, 1.5);
  const PickleObject& pair = pickle.at(root.items[5]);  // (list, list): the memo returns the same object
  ASSERT_EQ(pair.kind, PickleObject::Kind::Tuple);
  EXPECT_EQ(pair.items[0], pair.items[1]);
  EXPECT_EQ(pickle.at(pair.items[0]).items.size(), 2u);
  EXPECT_EQ(pickle.at(root.items[7]).kind, PickleObject::Kind::None);
  EXPECT_EQ(pickle.at(root.items[9]).integer, -32768) << "LONG1 is two's complement";
  EXPECT_EQ(pickle.bytes_read, bytes.size());
}

TEST(Unpickler, StructuralErrorsNameTheProblem) {
  expect_refused(kProto, "truncated");
  expect_refused(kProto + "t.", "TUPLE without a MARK");
  expect_refused(kProto + "R.", "REDUCE on an empty stack");
  expect_refused(kProto + "N(\x85.", "TUPLE1 on an empty stack (or past its MARK)");
  expect_refused(kProto + "NN.", "2 values on the stack");
  expect_refused(kProto + "(N.", "unclosed MARK");
  expect_refused(kProto + "h\x05.", "memo index 5");
  expect_refused(kProto + "j\x05\0\0\0."s, "memo index 5");
  expect_refused(kProto + "\x80\x06.", "protocol 6");
  expect_refused(kProto + "\x95\xff\0\0\0\0\0\0\0N."s, "FRAME of 255 bytes");
  expect_refused(kProto + "X\xff\xff\xff\x7f" "abc.", "BINUNICODE needs 2147483647 bytes");
  expect_refused(kProto + "X\x02\0\0\0\xc3\x28."s, "not valid UTF-8");
  expect_refused(kProto + "cos\nsys", "no terminating newline");
  expect_refused(kProto + "\xff.", "opcode 0xff");
  expect_refused(kProto + "I1\n.", "text opcode 'I'");
  expect_refused(kProto + "\x8f.", "set / frozenset");
  expect_refused(kProto + "P0\n.", "PERSID");
  expect_refused(kProto + "}(N" "Nu.", "dict key is a None");
  expect_refused(kProto + "}(Nu.", "odd number of values");
  expect_refused(kProto + "N]a.", "APPEND to a None");
  expect_refused(kProto + str("os") + str("system") + "\x93.", "refused global 'os.system'");
  expect_refused(kProto + "K\x01" + str("x") + "\x93.", "STACK_GLOBAL with a int module");
  expect_refused(kProto + "cos\nsys\xfftem\n.", "refused global 'os.sys\\xfftem'");
}

TEST(Unpickler, TensorsMustLieInsideTheirStorage) {
  const Pickle ok = unpickle_bytes(kProto + rebuild(6, 0, "K\x02K\x03\x86", "K\x03K\x01\x86") + ".");
  const PickleObject& tensor = ok.at(ok.root);
  ASSERT_EQ(tensor.kind, PickleObject::Kind::Tensor);
  EXPECT_EQ(tensor.shape, (Shape{2, 3}));
  EXPECT_EQ(tensor.strides, (Shape{3, 1}));
  EXPECT_EQ(ok.at(tensor.storage).numel, 6u);

  expect_refused(kProto + rebuild(6, 1, "K\x02K\x03\x86", "K\x03K\x01\x86") + ".", "reaches element 6 of a 6-element");
  expect_refused(kProto + rebuild(6, 0, "K\x02K\x03\x86", "K\x04K\x01\x86") + ".", "reaches element 6");
  expect_refused(kProto + rebuild(6, 0, "K\x02\x85", "K\x03K\x01\x86") + ".", "size has 1 dimensions but stride has 2");
  expect_refused(kProto + rebuild(6, 0, "J\xff\xff\xff\xff\x85", "K\x01\x85") + ".", "size is negative");
  expect_refused(kProto + rebuild(6, 0, "\x8a\x08\0\0\0\0\0\0\0\x40K\x04\x86"s, "K\x01K\x01\x86") + ".", "overflow");
  expect_refused(kProto + rebuild(6, 0, "N", "K\x01\x85") + ".", "size is a None, not a tuple");
  expect_refused(kProto + rebuild(2, 0, "K\x64\x85", "K\x00\x85"s) + ".", "100 elements, more than its 2-element storage");
  // A zero-element tensor touches nothing, wherever its offset points.
  EXPECT_EQ(unpickle_bytes(kProto + rebuild(0, 9, "K\x00\x85"s, "K\x01\x85") + ".").objects.size() > 0, true);
  // Argument counts and kinds of the rebuild functions.
  expect_refused(kProto + kRebuild + "(" + storage_pid(4) + "K\x00tR."s, "takes 6 or 7 arguments, got 2");
  expect_refused(kProto + kRebuild + "(NK\x00K\x01\x85K\x01\x85\x89}tR."s, "storage argument is a None");
  expect_refused(kProto + "ctorch._utils\n_rebuild_parameter\n(N\x89}tR.", "data is a None");
  expect_refused(kProto + "ccollections\nOrderedDict\n(NtR.", "OrderedDict takes no arguments");
}

TEST(Unpickler, PersistentIdsMustBeTorchStorageTuples) {
  expect_refused(kProto + "(" + str("storage") + "ctorch\nFloatStorage\n" + str("0") + str("cpu") + "tQ.", "has 4 items");
  expect_refused(kProto + "(" + str("storage") + str("FloatStorage") + str("0") + str("cpu") + "K\x01tQ.",
                 "type is a str, not a torch storage type");
  expect_refused(kProto + "(" + str("storage") + "ccollections\nOrderedDict\n" + str("0") + str("cpu") + "K\x01tQ.",
                 "type is a collections.OrderedDict");
  expect_refused(kProto + "(" + str("storage") + "ctorch\nFloatStorage\nK\x00"s + str("cpu") + "K\x01tQ.",
                 "storage key is a int");
  expect_refused(kProto + "(" + str("storage") + "ctorch\nFloatStorage\n" + str("0") + str("cpu") + "K\x01K\x01tQ.",
                 "view of another storage");
  expect_refused(kProto + "ctorch\nFloatStorage\n)R.", "calls a torch storage type");
}

// ---- damaged files ------------------------------------------------------------------------------

// Reads every byte of every tensor (so a sanitizer build catches a view past the mapping).
uint64_t touch_every_byte(const WeightSource& source) {
  uint64_t sum = 0;
  for (const TensorInfo& info : source.tensors()) {
    const auto* bytes = static_cast<const uint8_t*>(info.tensor.data);
    for (size_t i = 0; i < info.tensor.nbytes(); ++i) sum += bytes[i];
  }
  return sum;
}

class DamagedPickle : public ::testing::TestWithParam<std::string> {};

TEST_P(DamagedPickle, EveryTruncationIsAnError) {
  const std::string bytes = read_bytes(pickle_fixture(GetParam()));
  TempDir dir;
  const std::string path = dir.file("cut.pt");
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    write_bytes(path, std::string_view(bytes).substr(0, cut));
    try {
      open_pytorch(path);
      ADD_FAILURE() << GetParam() << " cut to " << cut << " of " << bytes.size() << " bytes loaded";
    } catch (const Error& error) {
      ASSERT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
    }
  }
}

TEST_P(DamagedPickle, RandomByteFlipsGiveAnErrorOrATensorInsideTheFile) {
  const std::string original = read_bytes(pickle_fixture(GetParam()));
  TempDir dir;
  const std::string path = dir.file("flipped.pt");
  std::mt19937_64 random(28);
  int loaded = 0, refused = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    std::string bytes = original;
    const int flips = 1 + static_cast<int>(random() % 4);
    for (int f = 0; f < flips; ++f) bytes[random() % bytes.size()] ^= static_cast<char>(1 + random() % 255);
    write_bytes(path, bytes);
    try {
      const auto source = open_pytorch(path);
      touch_every_byte(*source);
      ++loaded;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(loaded, 0) << "flips inside tensor data still load";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DamagedPickle, ::testing::Values("zip.pt", "legacy.pt", "nested.pt", "zip_protocol5.pt"),
                         [](const auto& info) { return info.param.substr(0, info.param.size() - 3); });

TEST(Pickle, CompressedZipEntriesAreRefused) {
  // A zip holding data.pkl deflated (zipfile's default for `zip -9`, never torch.save's).
  TempDir dir;
  std::string bytes = read_bytes(pickle_fixture("zip.pt"));
  // Set the method of every central directory entry to 8 (deflate); the stored bytes stay as they are.
  for (size_t i = 0; i + 46 <= bytes.size(); ++i)
    if (bytes.compare(i, 4, "PK\x01\x02") == 0) bytes[i + 10] = 8;
  write_bytes(dir.file("deflated.pt"), bytes);
  expect_error([&] { open_pytorch(dir.file("deflated.pt")); }, {"deflated.pt", "is compressed (method 8)"});
}

// ---- a real model -------------------------------------------------------------------------------

// Prefill logits of `source` on a fixed prompt (CPU backend, f32).
std::vector<float> prefill_logits(const WeightSource& source, const std::string& model_dir) {
  const ModelSpec spec = resolve_source_spec(source, model_dir);
  const ModelWeights weights = bind_weights(spec, source, DType::F32);
  auto backend = make_cpu_backend(2);
  const KvCacheConfig kv{16, 4};
  ModelRunner runner(spec, weights, *backend, kv);
  std::vector<int32_t> table(kv.num_blocks);
  for (int b = 0; b < kv.num_blocks; ++b) table[b] = b;
  ForwardBatch prefill;
  prefill.token_ids = {1, 403, 407, 261, 378, 11, 32, 75};
  prefill.spans = {{static_cast<int32_t>(prefill.token_ids.size()), 0, table, true}};
  prefill.logits_mode = LogitsMode::All;
  const Tensor logits = runner.forward(prefill);
  return {logits.as<float>(), logits.as<float>() + logits.numel()};
}

TEST(PickleModel, Stories260KConvertedByTorchGivesTheSafetensorsLogits) {
  const std::string original = shared_path("models/stories260K-hf");
  if (!fs::exists(original + "/model.safetensors")) GTEST_SKIP() << "no " << original;
  TempDir dir;
  const std::string script = fs::path(SPLITFLOW_TEST_FIXTURES).parent_path().parent_path() / "python/make_pickle_fixtures.py";
  const int status = std::system(("python3 " + shell_quote(script) + " --convert-model " + shell_quote(original) + " " +
                                  shell_quote(dir.path().string()) + " 2>/dev/null")
                                     .c_str());
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) GTEST_SKIP() << "python3 without torch / safetensors";
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "conversion failed: " << script;

  const std::vector<float> expected = prefill_logits(*open_weights(original), original);
  for (const char* layout : {"zip", "legacy", "sharded"}) {
    const std::string converted = (dir.path() / layout).string();
    const auto source = open_weights(converted);
    ASSERT_EQ(source->format(), "pytorch") << layout;
    EXPECT_EQ(prefill_logits(*source, converted), expected) << layout << ": logits differ from the safetensors model";
  }
  // And through the command line, as a user runs it.
  const CommandResult from_pickle = run_splitflow(
      {"generate", "--model", (dir.path() / "zip").string(), "--prompt", "Once upon a time", "--temperature", "0", "--max-tokens", "24"});
  const CommandResult from_safetensors =
      run_splitflow({"generate", "--model", original, "--prompt", "Once upon a time", "--temperature", "0", "--max-tokens", "24"});
  ASSERT_EQ(from_pickle.exit_code, 0) << from_pickle.err;
  EXPECT_EQ(from_pickle.out, from_safetensors.out);
  EXPECT_NE(from_pickle.err.find("pytorch"), std::string::npos) << from_pickle.err;
}

}  // namespace
}  // namespace splitflow
