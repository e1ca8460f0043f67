// llama2.c checkpoint reader: the legacy v0 file (7 int32 header, f32 tensors stacked per kind)
// and the "ak42" versioned files of llama2.c's export.py: version 1 (f32) and version 2 (Q8_0 int8
// values with one f32 scale per group). Version 2 matrices (the embedding included) stay int8:
// repacked into I8_G32 / I8_G64 / I8_G128 rows (core/dtype.h), the int8 bytes and f32 scales copied
// unchanged; only a group size without such a type, or one that does not divide the row length,
// falls back to owned f32 tensors. Tensors get Meta Llama names; matrices are [out, in].
#include "core/error.h"
#include "core/mapped_file.h"
#include "formats/byte_reader.h"
#include "formats/weight_set.h"

#include <cstdlib>
#include <cstring>
#include <optional>

namespace splitflow {
namespace {

constexpr uint32_t kMagic = 0x616b3432;  // "ak42"
constexpr uint64_t kVersionedHeaderBytes = 256;

struct Header {
  int32_t version = 0;  // 0: legacy, 1: f32, 2: Q8_0
  int32_t dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab_size = 0, seq_len = 0;
  bool shared_classifier = true;
  int32_t group_size = 0;  // version 2 only
  uint64_t header_bytes = 0;

  std::string describe() const {
    return fmt::format("version {}, dim {}, hidden_dim {}, n_layers {}, n_heads {}, n_kv_heads {}, vocab_size {}, seq_len {}{}",
                       version, dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len,
                       version == 2 ? fmt::format(", group_size {}", group_size) : "");
  }
};

Header read_header(ByteReader& in) {
  Header header;
  const auto first = in.read<uint32_t>("llama2.c header");
  if (first == kMagic) {
    header.version = in.read<int32_t>("llama2.c version");
    SF_CHECK(header.version == 1 || header.version == 2, "'{}': llama2.c version {} is not supported (0, 1 or 2)",
             in.path(), header.version);
    header.dim = in.read<int32_t>("llama2.c header");
  } else {
    header.dim = static_cast<int32_t>(first);
  }
  for (int32_t* field : {&header.hidden_dim, &header.n_layers, &header.n_heads, &header.n_kv_heads, &header.vocab_size,
                         &header.seq_len})
    *field = in.read<int32_t>("llama2.c header");
  if (header.version == 0) {
    // A negative vocab_size marks an unshared classifier stored after the other tensors.
    header.shared_classifier = header.vocab_size > 0;
    header.vocab_size = header.vocab_size == INT32_MIN ? 0 : std::abs(header.vocab_size);
    header.header_bytes = in.offset();
  } else {
    const auto flag = in.read<uint8_t>("llama2.c shared_classifier flag");
    SF_CHECK(flag <= 1, "'{}': llama2.c shared_classifier flag is {} (must be 0 or 1)", in.path(), flag);
    header.shared_classifier = flag == 1;
    if (header.version == 2) header.group_size = in.read<int32_t>("llama2.c group_size");
    header.header_bytes = kVersionedHeaderBytes;
  }

  const std::pair<const char*, int32_t> positive[] = {
      {"dim", header.dim},         {"hidden_dim", header.hidden_dim}, {"n_layers", header.n_layers},
      {"n_heads", header.n_heads}, {"n_kv_heads", header.n_kv_heads}, {"vocab_size", header.vocab_size},
      {"seq_len", header.seq_len}};
  for (const auto& [field, value] : positive)
    SF_CHECK(value > 0, "'{}': llama2.c header field {} is {} (must be positive; {})", in.path(), field, value,
             header.describe());
  // The exact file-size match (open_llama2c) bounds every other field; versions 1 and 2 store no
  // RoPE tables, so nothing in the file bounds their seq_len, which sizes the KV cache.
  SF_CHECK(uint64_t(header.seq_len) <= kMaxContextTokens,
           "'{}': llama2.c header field seq_len is {}, more than the {} any model needs ({})", in.path(),
           header.seq_len, kMaxContextTokens, header.describe());
  SF_CHECK(header.dim % header.n_heads == 0 && header.n_heads % header.n_kv_heads == 0,
           "'{}': llama2.c header needs dim divisible by n_heads and n_heads by n_kv_heads ({})", in.path(),
           header.describe());
  SF_CHECK(header.version != 2 || header.group_size > 0, "'{}': llama2.c group_size is {} (must be positive)",
           in.path(), header.group_size);
  return header;
}

enum class Storage { F32, Q8_0, Skip };

// One tensor, or one tensor per layer stored back to back (then `name` has a {} for the layer).
struct Block {
  std::string name;
  Shape shape;
  Storage storage;
  bool per_layer;
};

// The tensors in file order, as llama2.c's run.c (version 0) and export.py (versions 1, 2) lay them out.
std::vector<Block> file_layout(const Header& h) {
  const int64_t dim = h.dim, hidden = h.hidden_dim, vocab = h.vocab_size;
  const int64_t head_size = dim / h.n_heads, kv_dim = head_size * h.n_kv_heads;
  const Storage matrix = h.version == 2 ? Storage::Q8_0 : Storage::F32;
  std::vector<Block> blocks;
  auto one = [&](std::string name, Shape shape, Storage storage) { blocks.push_back({std::move(name), std::move(shape), storage, false}); };
  auto per_layer = [&](std::string name, Shape shape, Storage storage) { blocks.push_back({std::move(name), std::move(shape), storage, true}); };
  auto attention = [&] {
    per_layer("layers.{}.attention.wq.weight", {dim, dim}, matrix);
    per_layer("layers.{}.attention.wk.weight", {kv_dim, dim}, matrix);
    per_layer("layers.{}.attention.wv.weight", {kv_dim, dim}, matrix);
    per_layer("layers.{}.attention.wo.weight", {dim, dim}, matrix);
  };
  auto ffn = [&] {
    per_layer("layers.{}.feed_forward.w1.weight", {hidden, dim}, matrix);
    per_layer("layers.{}.feed_forward.w2.weight", {dim, hidden}, matrix);
    per_layer("layers.{}.feed_forward.w3.weight", {hidden, dim}, matrix);
  };
  if (h.version == 0) {
    one("tok_embeddings.weight", {vocab, dim}, Storage::F32);
    per_layer("layers.{}.attention_norm.weight", {dim}, Storage::F32);
    attention();
    per_layer("layers.{}.ffn_norm.weight", {dim}, Storage::F32);
    ffn();
    one("norm.weight", {dim}, Storage::F32);
    one("freq_cis_real", {h.seq_len, head_size / 2}, Storage::Skip);  // unused RoPE tables
    one("freq_cis_imag", {h.seq_len, head_size / 2}, Storage::Skip);
  } else {
    per_layer("layers.{}.attention_norm.weight", {dim}, Storage::F32);
    per_layer("layers.{}.ffn_norm.weight", {dim}, Storage::F32);
    one("norm.weight", {dim}, Storage::F32);
    one("tok_embeddings.weight", {vocab, dim}, matrix);
    attention();
    ffn();
  }
  if (!h.shared_classifier) one("output.weight", {vocab, dim}, matrix);
  return blocks;
}

// Bytes of one tensor of `block`.
uint64_t stored_bytes(const Block& block, const Header& h, const std::string& path) {
  const auto numel = static_cast<uint64_t>(shape_numel(block.shape));  // rank <= 2, extents < 2^31: no overflow
  if (block.storage != Storage::Q8_0) return checked_mul(numel, 4, fmt::format("'{}': tensor '{}' size", path, block.name));
  SF_CHECK(numel % h.group_size == 0, "'{}': tensor '{}' has {} elements, not a multiple of group_size {}", path,
           block.name, numel, h.group_size);
  return numel + numel / h.group_size * 4;  // int8 values, then one f32 scale per group
}

// int8 values followed by one f32 scale per `group_size` values; w = q * scale.
Tensor dequantize_q8_0(const uint8_t* bytes, Shape shape, int64_t group_size) {
  Tensor out = Tensor::zeros(DType::F32, std::move(shape));
  const int64_t numel = out.numel();
  const auto* values = reinterpret_cast<const int8_t*>(bytes);
  const uint8_t* scales = bytes + numel;
  float* weights = out.as<float>();
  for (int64_t group = 0; group < numel / group_size; ++group) {
    float scale;
    std::memcpy(&scale, scales + group * sizeof(float), sizeof scale);  // may be unaligned
    for (int64_t i = group * group_size; i < (group + 1) * group_size; ++i) weights[i] = values[i] * scale;
  }
  return out;
}

// The packed type holding llama2.c's groups of `group_size` along rows of `cols`, when there is one.
// export.py groups the flattened tensor, so a group lies within a row only when group_size divides
// cols; otherwise (or for a group size with no I8 type: export.py's default is 64, any size is
// allowed) the caller keeps the f32 dequantization, as exact as the packed form but 4x the size.
std::optional<DType> packed_type(int64_t cols, int64_t group_size) {
  if (cols % group_size != 0) return std::nullopt;
  switch (group_size) {
    case 32: return DType::I8_G32;
    case 64: return DType::I8_G64;
    case 128: return DType::I8_G128;
    default: return std::nullopt;
  }
}

// The same values as `type` rows: per row its cols / group_size scales (f32, padded to 16 bytes),
// then its cols int8 values, both copied byte for byte from the file's two arrays.
Tensor repack_q8_0(const uint8_t* bytes, Shape shape, int64_t group_size, DType type) {
  Tensor out = Tensor::zeros(type, std::move(shape));
  const int64_t cols = out.shape.back(), rows = out.numel() / cols, groups = cols / group_size;
  const size_t row_bytes = dtype_row_bytes(type, cols);
  const size_t scale_bytes = row_bytes - static_cast<size_t>(cols);
  const uint8_t* scales = bytes + out.numel();
  auto* packed = out.as<uint8_t>();
  for (int64_t row = 0; row < rows; ++row) {
    uint8_t* dst = packed + row * row_bytes;
    std::memcpy(dst, scales + row * groups * sizeof(float), static_cast<size_t>(groups) * sizeof(float));
    std::memcpy(dst + scale_bytes, bytes + row * cols, static_cast<size_t>(cols));
  }
  return out;
}

}  // namespace

std::unique_ptr<WeightSource> open_llama2c(const std::string& path) {
  const auto file = MappedFile::open(path);
  ByteReader in(*file);
  const Header header = read_header(in);
  const std::vector<Block> blocks = file_layout(header);

  // The size check comes before any per-layer work, so an absurd header costs nothing.
  uint64_t expected_bytes = header.header_bytes;
  for (const Block& block : blocks) {
    const uint64_t count = block.per_layer ? header.n_layers : 1;
    const uint64_t block_bytes = checked_mul(count, stored_bytes(block, header, path), fmt::format("'{}': size of '{}'", path, block.name));
    expected_bytes = checked_add(expected_bytes, block_bytes, fmt::format("'{}': llama2.c file size", path));
  }
  SF_CHECK(expected_bytes == file->size(), "'{}': llama2.c header ({}) implies {} bytes, but the file has {} bytes",
           path, header.describe(), expected_bytes, file->size());

  auto source = std::make_unique<WeightSet>("llama2c");
  uint64_t offset = header.header_bytes;
  for (const Block& block : blocks) {
    const uint64_t bytes_each = stored_bytes(block, header, path);
    for (int32_t layer = 0; layer < (block.per_layer ? header.n_layers : 1); ++layer, offset += bytes_each) {
      const std::string name = block.per_layer ? fmt::format(fmt::runtime(block.name), layer) : block.name;
      const uint8_t* bytes = file->data() + offset;
      if (block.storage == Storage::F32)
        source->add(name, tensor_from_file(DType::F32, block.shape, bytes, file), path);
      else if (block.storage == Storage::Q8_0) {
        const std::optional<DType> type = packed_type(block.shape.back(), header.group_size);
        source->add(name,
                    type ? repack_q8_0(bytes, block.shape, header.group_size, *type)
                         : dequantize_q8_0(bytes, block.shape, header.group_size),
                    path);
      }
    }
  }
  source->metadata() = {{"dim", header.dim},
                        {"hidden_dim", header.hidden_dim},
                        {"n_layers", header.n_layers},
                        {"n_heads", header.n_heads},
                        {"n_kv_heads", header.n_kv_heads},
                        {"vocab_size", header.vocab_size},
                        {"seq_len", header.seq_len},
                        {"shared_classifier", header.shared_classifier},
                        {"version", header.version}};
  if (header.version == 2) source->metadata()["group_size"] = header.group_size;
  return source;
}

}  // namespace splitflow
