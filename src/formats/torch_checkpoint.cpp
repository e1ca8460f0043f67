// PyTorch checkpoint readers (declared in formats/pickle.h). Two layouts:
//  - zip (torch >= 1.6): `<dir>/data.pkl` (the object pickle), `<dir>/data/<key>` (each storage's
//    raw bytes, stored and 64-byte aligned), `<dir>/byteorder` ("little"; absent before torch 2.1).
//  - legacy: five pickles back to back (magic number 0x1950a86a20f9469cfc6c, protocol version 1001,
//    sys_info {little_endian, type_sizes, ...}, the object pickle, the list of storage keys), then per
//    key in that order an int64 element count and the storage's raw bytes.
// Storages are named by the persistent ids in the object pickle; a tensor is a strided view of one.
#include "core/error.h"
#include "core/mapped_file.h"
#include "formats/byte_reader.h"
#include "formats/pickle.h"
#include "formats/torch_zip.h"
#include "formats/weight_set.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <unordered_map>

namespace splitflow {
namespace {

using Kind = PickleObject::Kind;
using nlohmann::json;

// The legacy magic number pickle: PROTO 2, LONG1 of 10 bytes (0x1950a86a20f9469cfc6c), STOP.
constexpr uint8_t kLegacyMagicPickle[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                          0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, '.'};
constexpr int64_t kLegacyProtocolVersion = 1001;
// Nesting and object visits while naming tensors: far above a real checkpoint (a state dict is one
// level, a training checkpoint three or four), and a bound on a crafted graph that shares or
// contains itself.
constexpr int kMaxNesting = 64;
constexpr uint64_t kMaxVisits = uint64_t(1) << 22;

bool has_legacy_magic(const MappedFile& file) {
  return file.size() >= sizeof kLegacyMagicPickle &&
         std::memcmp(file.data(), kLegacyMagicPickle, sizeof kLegacyMagicPickle) == 0;
}

// A storage's bytes inside the mapped file.
struct StorageBytes {
  DType dtype;
  uint64_t numel;
  const uint8_t* data = nullptr;
};
using StorageTable = std::unordered_map<std::string, StorageBytes>;

// Every storage key the object pickle names, with its dtype and element count; all uses of a key
// must agree (torch.save gives each storage one key).
StorageTable referenced_storages(const Pickle& pickle, const std::string& path) {
  StorageTable table;
  for (const PickleObject& object : pickle.objects) {
    if (object.kind != Kind::Storage) continue;
    const auto [it, inserted] = table.try_emplace(object.text, StorageBytes{object.dtype, object.numel});
    SF_CHECK(inserted || (it->second.dtype == object.dtype && it->second.numel == object.numel),
             "'{}': storage '{}' is named twice with different types or sizes ({} x {} and {} x {})", path, object.text,
             it->second.numel, dtype_name(it->second.dtype), object.numel, dtype_name(object.dtype));
  }
  return table;
}

uint64_t storage_bytes_needed(const std::string& path, const std::string& key, const StorageBytes& storage) {
  return checked_mul(storage.numel, dtype_size(storage.dtype), fmt::format("'{}': storage '{}' byte size", path, key));
}

// A tensor is contiguous when its strides are the row-major ones; extents of 1 may have any stride
// (as torch's is_contiguous allows).
bool is_contiguous(const PickleObject& tensor) {
  int64_t expected = 1;
  for (size_t d = tensor.shape.size(); d-- > 0;) {
    if (tensor.shape[d] != 1 && tensor.strides[d] != expected) return false;
    expected *= tensor.shape[d];
  }
  return true;
}

// The tensor's values: a view of the mapping when contiguous, else gathered element by element into
// an owned tensor. The unpickler has checked that every element lies inside the storage, and the
// storage's bytes have been checked against the file.
Tensor materialize(const PickleObject& tensor, const StorageBytes& storage, const std::shared_ptr<const MappedFile>& file) {
  const size_t element_bytes = dtype_size(tensor.dtype);
  if (shape_numel(tensor.shape) == 0) return Tensor::view(tensor.dtype, tensor.shape, storage.data, file);
  if (is_contiguous(tensor))
    return tensor_from_file(tensor.dtype, tensor.shape, storage.data + tensor.storage_offset * element_bytes, file);
  Tensor owned = Tensor::zeros(tensor.dtype, tensor.shape);
  auto* out = static_cast<uint8_t*>(owned.data);
  const size_t dims = tensor.shape.size();
  std::vector<int64_t> index(dims, 0);
  const int64_t numel = shape_numel(tensor.shape);
  for (int64_t i = 0; i < numel; ++i) {
    uint64_t element = tensor.storage_offset;
    for (size_t d = 0; d < dims; ++d) element += uint64_t(index[d]) * uint64_t(tensor.strides[d]);
    std::memcpy(out + size_t(i) * element_bytes, storage.data + element * element_bytes, element_bytes);
    for (size_t d = dims; d-- > 0;) {
      if (++index[d] < tensor.shape[d]) break;
      index[d] = 0;
    }
  }
  return owned;
}

// Walks the object pickle from its root, adding tensors under their joined key and plain scalars
// to metadata.
class TensorCollector {
 public:
  TensorCollector(const Pickle& pickle, const StorageTable& storages, std::shared_ptr<const MappedFile> file,
                  WeightSet& out)
      : pickle_(pickle), storages_(storages), file_(std::move(file)), out_(out), on_path_(pickle.objects.size()) {}

  void collect_root() {
    const PickleObject& root = pickle_.at(pickle_.root);
    SF_CHECK(root.kind == Kind::Dict, "'{}': the checkpoint holds a {}, not a dict of tensors (a state dict)",
             file_->path(), kind_label(root.kind));
    collect(pickle_.root, "", 0);
  }

 private:
  static std::string_view kind_label(Kind kind) {
    switch (kind) {
      case Kind::Tensor: return "single tensor";
      case Kind::List: return "list";
      case Kind::Tuple: return "tuple";
      default: return "plain value";
    }
  }
  static std::string join(const std::string& prefix, const std::string& key) {
    return prefix.empty() ? key : prefix + "." + key;
  }
  std::string key_text(uint32_t index, const std::string& prefix) const {
    const PickleObject& key = pickle_.at(index);
    if (key.kind == Kind::String) return key.text;
    if (key.kind == Kind::Int) return std::to_string(key.integer);
    fail("'{}': a dict key under '{}' is neither a str nor an int", file_->path(), prefix);
  }

  void collect(uint32_t index, const std::string& name, int depth) {
    SF_CHECK(++visits_ <= kMaxVisits, "'{}': the checkpoint's object graph has more than {} references", file_->path(),
             kMaxVisits);
    const PickleObject& object = pickle_.at(index);
    switch (object.kind) {
      case Kind::Tensor: {
        const PickleObject& storage = pickle_.at(object.storage);
        out_.add(name, materialize(object, storages_.at(storage.text), file_), file_->path());
        return;
      }
      case Kind::Dict:
      case Kind::List:
      case Kind::Tuple: {
        SF_CHECK(depth < kMaxNesting, "'{}': containers nest deeper than {} levels at '{}'", file_->path(), kMaxNesting,
                 name);
        SF_CHECK(!on_path_[index], "'{}': the container at '{}' contains itself", file_->path(), name);
        on_path_[index] = true;
        if (object.kind == Kind::Dict) {
          for (size_t i = 0; i < object.items.size(); i += 2)
            collect(object.items[i + 1], join(name, key_text(object.items[i], name)), depth + 1);
        } else {
          for (size_t i = 0; i < object.items.size(); ++i) collect(object.items[i], join(name, std::to_string(i)), depth + 1);
        }
        on_path_[index] = false;
        return;
      }
      case Kind::None: out_.metadata()[name] = nullptr; return;
      case Kind::Bool: out_.metadata()[name] = object.boolean; return;
      case Kind::Int: out_.metadata()[name] = object.integer; return;
      case Kind::Float: out_.metadata()[name] = object.real; return;
      case Kind::String: out_.metadata()[name] = object.text; return;
      default: return;  // bytes, huge ints, bare globals and storages: nothing a model loader reads
    }
  }

  const Pickle& pickle_;
  const StorageTable& storages_;
  std::shared_ptr<const MappedFile> file_;
  WeightSet& out_;
  std::vector<bool> on_path_;
  uint64_t visits_ = 0;
};

std::unique_ptr<WeightSource> read_zip_checkpoint(const std::shared_ptr<const MappedFile>& file) {
  const std::string& path = file->path();
  const StoredZip zip(*file);
  // The archive's one top-level folder (torch names it after the file) holds data.pkl.
  const ZipEntry* pickle_entry = nullptr;
  for (const ZipEntry& entry : zip.entries()) {
    const size_t slash = entry.name.find('/');
    if (slash == std::string::npos || entry.name.compare(slash, std::string::npos, "/data.pkl") != 0) continue;
    SF_CHECK(pickle_entry == nullptr, "'{}': the zip holds two object pickles, '{}' and '{}'", path, pickle_entry->name,
             entry.name);
    pickle_entry = &entry;
  }
  SF_CHECK(pickle_entry != nullptr, "'{}': a zip, but not a PyTorch checkpoint: no '<folder>/data.pkl' entry", path);
  const std::string folder = pickle_entry->name.substr(0, pickle_entry->name.size() - std::string_view("data.pkl").size());
  if (const ZipEntry* byteorder = zip.find(folder + "byteorder")) {
    const std::string_view order(reinterpret_cast<const char*>(zip.data(*byteorder)), byteorder->size);
    SF_CHECK(order == "little", "'{}': the checkpoint was saved on a '{}'-endian machine; only little-endian is read",
             path, order.substr(0, 16));
  }

  const Pickle pickle =
      unpickle_restricted(zip.data(*pickle_entry), pickle_entry->size, fmt::format("'{}': pickle '{}'", path, pickle_entry->name));
  StorageTable storages = referenced_storages(pickle, path);
  for (auto& [key, storage] : storages) {
    const ZipEntry* entry = zip.find(folder + "data/" + key);
    SF_CHECK(entry != nullptr, "'{}': storage '{}' has no entry '{}data/{}'", path, key, folder, key);
    const uint64_t needed = storage_bytes_needed(path, key, storage);
    SF_CHECK(entry->size == needed, "'{}': storage '{}' of {} x {} needs {} bytes but its entry holds {}", path, key,
             storage.numel, dtype_name(storage.dtype), needed, entry->size);
    storage.data = zip.data(*entry);
  }
  auto source = std::make_unique<WeightSet>("pytorch");
  TensorCollector(pickle, storages, file, *source).collect_root();
  return source;
}

std::unique_ptr<WeightSource> read_legacy_checkpoint(const std::shared_ptr<const MappedFile>& file) {
  const std::string& path = file->path();
  size_t offset = 0;
  const auto next_pickle = [&](std::string_view what) {
    Pickle pickle = unpickle_restricted(file->data() + offset, file->size() - offset,
                                        fmt::format("'{}': legacy {} pickle (byte {})", path, what, offset));
    offset += pickle.bytes_read;
    return pickle;
  };
  next_pickle("magic number");  // has_legacy_magic() matched its bytes exactly
  const Pickle version = next_pickle("protocol version");
  SF_CHECK(version.at(version.root).kind == Kind::Int && version.at(version.root).integer == kLegacyProtocolVersion,
           "'{}': legacy checkpoint protocol version is not {}", path, kLegacyProtocolVersion);
  const Pickle sys_info = next_pickle("sys_info");
  const PickleObject& info = sys_info.at(sys_info.root);
  SF_CHECK(info.kind == Kind::Dict, "'{}': legacy sys_info is not a dict", path);
  for (size_t i = 0; i < info.items.size(); i += 2) {
    const PickleObject &key = sys_info.at(info.items[i]), &value = sys_info.at(info.items[i + 1]);
    if (key.kind == Kind::String && key.text == "little_endian")
      SF_CHECK(value.kind == Kind::Bool && value.boolean, "'{}': the checkpoint was saved on a big-endian machine", path);
  }
  const Pickle pickle = next_pickle("object");
  const Pickle keys = next_pickle("storage keys");
  const PickleObject& key_list = keys.at(keys.root);
  SF_CHECK(key_list.kind == Kind::List, "'{}': the legacy storage key pickle holds no list", path);

  StorageTable storages = referenced_storages(pickle, path);
  for (const uint32_t key_index : key_list.items) {
    const PickleObject& key = keys.at(key_index);
    SF_CHECK(key.kind == Kind::String, "'{}': a legacy storage key is not a str", path);
    const auto it = storages.find(key.text);
    SF_CHECK(it != storages.end(), "'{}': legacy storage '{}' is not used by any tensor (its element type is unknown)",
             path, key.text);
    StorageBytes& storage = it->second;
    SF_CHECK(storage.data == nullptr, "'{}': legacy storage '{}' is listed twice", path, key.text);
    SF_CHECK(file->size() - offset >= 8, "'{}': truncated: storage '{}' element count needs 8 bytes at offset {}", path,
             key.text, offset);
    uint64_t count;
    std::memcpy(&count, file->data() + offset, 8);
    offset += 8;
    SF_CHECK(count == storage.numel, "'{}': legacy storage '{}' holds {} elements but its persistent id says {}", path,
             key.text, count, storage.numel);
    const uint64_t needed = storage_bytes_needed(path, key.text, storage);
    SF_CHECK(needed <= file->size() - offset, "'{}': truncated: storage '{}' needs {} bytes at offset {}, {} remain",
             path, key.text, needed, offset, file->size() - offset);
    storage.data = file->data() + offset;
    offset += needed;
  }
  for (const auto& [key, storage] : storages)
    SF_CHECK(storage.data != nullptr, "'{}': storage '{}' is used by a tensor but not in the legacy storage list", path, key);
  auto source = std::make_unique<WeightSet>("pytorch");
  TensorCollector(pickle, storages, file, *source).collect_root();
  return source;
}

}  // namespace

bool looks_like_pytorch(const MappedFile& file) { return looks_like_zip(file) || has_legacy_magic(file); }

std::unique_ptr<WeightSource> open_pytorch(const std::string& path) {
  const auto file = MappedFile::open(path);
  if (looks_like_zip(*file)) return read_zip_checkpoint(file);
  if (has_legacy_magic(*file)) return read_legacy_checkpoint(file);
  fail("'{}': not a PyTorch checkpoint: neither a zip archive (torch.save since 1.6) nor the legacy pickle format "
       "(the tar format of torch < 0.4 is not supported)",
       path);
}

std::unique_ptr<WeightSource> open_pytorch_index(const std::string& index_path) {
  return open_sharded_index(index_path, "pytorch", "the PyTorch checkpoint index", open_pytorch);
}

}  // namespace splitflow
