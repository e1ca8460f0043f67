// formats/pickle.h — a restricted unpickler for PyTorch checkpoints, and the PyTorch checkpoint
// readers built on it (`.bin` / `.pt` / `.pth`: the zip container of torch >= 1.6, its sharded
// `pytorch_model.bin.index.json`, and the legacy non-zip format).
//
// Owns: decoding the pickle opcodes torch.save emits (protocols 2-5) into plain values, torch
// storages and tensors. The only globals it knows are collections.OrderedDict, torch's tensor and
// parameter rebuild functions and torch's storage types; every other global is an Error naming it,
// at the opcode that names it, before anything else happens. Must never: call, import or evaluate
// anything a file names (nothing here runs code: "calling" a known global builds a value), accept
// a persistent id other than torch's storage tuple, or use an offset, length, memo index or stack
// slot before checking it.
#pragma once

#include "core/dtype.h"
#include "core/tensor.h"
#include "formats/weight_source.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace splitflow {

class MappedFile;

// One value the unpickler built. Objects refer to each other by index into Pickle::objects (the
// memo can make a container hold itself, so there is no ownership between objects).
struct PickleObject {
  enum class Kind : uint8_t {
    None, Bool, Int, BigInt, Float, String, Bytes, Tuple, List, Dict,
    Global,   // a whitelisted callable or storage type, not yet called (`global` says which)
    Storage,  // from a persistent id ('storage', torch.<T>Storage, key, location, numel)
    Tensor,   // from torch._utils._rebuild_tensor_v2 and relatives
  };
  enum class Global : uint8_t {
    OrderedDict, RebuildTensorV2, RebuildTensor, RebuildParameter, RebuildParameterWithState, StorageType
  };

  Kind kind = Kind::None;
  Global global = Global::OrderedDict;  // Global
  bool boolean = false;                 // Bool
  int64_t integer = 0;                  // Int
  double real = 0;                      // Float
  std::string text;             // String (UTF-8), Bytes; BigInt: little-endian two's complement; Storage: key
  std::vector<uint32_t> items;  // Tuple, List: elements; Dict: key, value, key, value, ... in insertion order
  DType dtype = DType::F32;     // Global (StorageType), Storage, Tensor
  uint64_t numel = 0;           // Storage: elements
  std::string location;         // Storage: "cpu", "cuda:0", ...
  uint32_t storage = 0;         // Tensor: index of its Storage object
  uint64_t storage_offset = 0;  // Tensor: in elements
  Shape shape;                  // Tensor
  std::vector<int64_t> strides; // Tensor: in elements, one per dimension
};

struct Pickle {
  std::vector<PickleObject> objects;
  uint32_t root = 0;        // the object STOP returned
  size_t bytes_read = 0;    // through the STOP opcode (the legacy format puts pickles back to back)
  const PickleObject& at(uint32_t index) const { return objects[index]; }
};

// Unpickles the pickle that starts at `bytes` (`size` bytes available; it may end before them).
// `where` names it in every error ("'model.bin': pickle 'archive/data.pkl'"). Tensors are checked
// against their storage's element count; storages are not resolved to bytes here.
Pickle unpickle_restricted(const uint8_t* bytes, size_t size, const std::string& where);

// True when `file` starts like a PyTorch checkpoint: a zip archive or the legacy format's magic
// number pickle.
bool looks_like_pytorch(const MappedFile& file);
// Opens one PyTorch checkpoint. The object it holds must be a dict (usually a state dict); nested
// dicts, lists and tuples name their tensors by joining keys with '.'; ints, floats, strings, bools
// and None go to metadata() under the same joined key. Contiguous tensors are views into the
// mapping (copied when misaligned, as in the legacy format); a strided (non-contiguous) view is
// materialized into an owned contiguous tensor. Several tensors may share a storage.
std::unique_ptr<WeightSource> open_pytorch(const std::string& path);
// Opens every shard listed in `pytorch_model.bin.index.json` (a path to the index file).
std::unique_ptr<WeightSource> open_pytorch_index(const std::string& index_path);

}  // namespace splitflow
