#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<harness>/ (small files: git holds them).

Real files from ../shared (models/, tokenizer-vectors/) and tests/fixtures are shrunk: tensors cut
to a few elements with names, dtypes and metadata kept, vocabularies cut to a few hundred entries
with their normalizers, pre-tokenizers, decoders and special tokens kept. Deterministic; run from
the repository root: python3 fuzz/make_seeds.py
"""
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("SPLITFLOW_SHARED_DIR", ROOT.parent / "shared"))
CORPUS = ROOT / "fuzz" / "corpus"
RNG = np.random.default_rng(1234)


def put(harness, name, data):
    folder = CORPUS / harness
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (folder / name).write_bytes(data)


# --- safetensors -------------------------------------------------------------------------------
ST_DTYPES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I8": 1, "I16": 2, "I32": 4, "I64": 8, "U8": 1, "BOOL": 1, "F8_E4M3": 1}


def safetensors_bytes(entries, metadata=None, pad=8):
    """entries: [(name, dtype, shape)] -> a file with random data."""
    header, data, offset = {}, b"", 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in entries:
        nbytes = int(np.prod(shape, dtype=np.int64)) * ST_DTYPES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        data += RNG.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % pad)
    return struct.pack("<Q", len(text)) + text + data


def shrunk_safetensors(path, max_tensors=24):
    """The header of a real file with every tensor cut to at most 2 elements per dimension."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    entries = [(n, e["dtype"], [min(d, 2) for d in e["shape"]]) for n, e in header.items() if n != "__metadata__"]
    return safetensors_bytes(entries[:max_tensors], header.get("__metadata__"))


def safetensors_seeds():
    for path in [SHARED / "models/stories260K-hf/model.safetensors"] + sorted((ROOT / "tests/fixtures/hf").glob("*/model.safetensors"))[:6] + [ROOT / "tests/fixtures/quant/fp8_checkpoint.safetensors"]:
        if path.exists():
            put("safetensors", f"shrunk_{path.parent.name}_{path.stem}.safetensors", shrunk_safetensors(path))
    put("safetensors", "every_dtype.safetensors",
        safetensors_bytes([(f"t.{d.lower()}", d, [2, 3]) for d in ST_DTYPES], {"format": "pt"}))
    put("safetensors", "odd_header.safetensors", safetensors_bytes([("a", "F32", [3]), ("b", "F16", [1, 2])], pad=1))
    put("safetensors", "scalar_and_empty.safetensors", safetensors_bytes([("s", "F32", []), ("e", "BF16", [0, 4])]))
    put("safetensors", "empty.safetensors", safetensors_bytes([]))


# --- GGUF --------------------------------------------------------------------------------------
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR_FORMATS = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


def gguf_string(text):
    data = text if isinstance(text, bytes) else text.encode()
    return struct.pack("<Q", len(data)) + data


def gguf_value(vtype, value, element_type=None):
    if vtype == STRING:
        return gguf_string(value)
    if vtype == ARRAY:
        out = struct.pack("<IQ", element_type, len(value))
        return out + b"".join(gguf_value(element_type, v) for v in value)
    return struct.pack(SCALAR_FORMATS[vtype], value)


# ggml type -> (block elements, block bytes)
GGML_BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 10: (256, 84),
               11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 24: (1, 1), 25: (1, 2), 26: (1, 4),
               27: (1, 8), 28: (1, 8), 30: (1, 2)}


def gguf_bytes(kvs, tensors, version=3, alignment=32):
    """kvs: [(key, type, value, element_type)]; tensors: [(name, ne innermost first, ggml type)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, vtype, value, element_type in kvs:
        out += gguf_string(key) + struct.pack("<I", vtype) + gguf_value(vtype, value, element_type)
    datas, offset = [], 0
    for name, ne, ggml_type in tensors:
        block_elems, block_bytes = GGML_BLOCKS[ggml_type]
        nbytes = int(np.prod(ne, dtype=np.int64)) // block_elems * block_bytes
        out += gguf_string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", ggml_type, offset)
        datas.append(RNG.integers(0, 256, nbytes, dtype=np.uint8).tobytes())
        offset += (nbytes + alignment - 1) // alignment * alignment
    out += b"\0" * ((-len(out)) % alignment)
    for data in datas:
        out += data + b"\0" * ((-len(data)) % alignment)
    return out


def read_gguf_kvs(path):
    """The key/values of a real GGUF as [(key, type, value, element_type)] plus its tensor infos."""
    from gguf import GGUFReader
    reader = GGUFReader(str(path))
    kvs = []
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):
            continue
        vtype = int(field.types[0])
        if vtype == ARRAY:
            element_type = int(field.types[1])
            if element_type == STRING:
                value = [bytes(field.parts[i]) for i in field.data]
            else:
                value = [field.parts[i][0].item() for i in field.data]
            kvs.append((field.name, ARRAY, value, element_type))
        elif vtype == STRING:
            kvs.append((field.name, STRING, bytes(field.parts[field.data[0]]), None))
        else:
            kvs.append((field.name, vtype, field.parts[field.data[0]][0].item(), None))
    tensors = [(t.name, [int(d) for d in t.shape], int(t.tensor_type)) for t in reader.tensors]
    return kvs, tensors


def shrink_vocab(kvs, keep):
    """Token arrays cut to `keep` entries, merges to those of kept tokens, special ids beyond the cut
    moved onto the last kept slots (taking their token along)."""
    by_key = {k: i for i, (k, *_rest) in enumerate(kvs)}
    tokens_entry = kvs[by_key["tokenizer.ggml.tokens"]]
    tokens = tokens_entry[2]
    if len(tokens) <= keep:
        return kvs
    new_tokens = list(tokens[:keep])
    moved = {}
    slot = keep - 1
    out = []
    for key, vtype, value, element_type in kvs:
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id") and vtype in SCALAR_FORMATS and value >= keep:
            if value not in moved:
                moved[value] = slot
                new_tokens[slot] = tokens[value]
                slot -= 1
            value = moved[value]
        out.append((key, vtype, value, element_type))
    kvs = out
    out = []
    kept = set(new_tokens)
    for key, vtype, value, element_type in kvs:
        if key == "tokenizer.ggml.tokens":
            value = new_tokens
        elif key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            cut = list(value[:keep])
            for old, new in moved.items():
                cut[new] = value[old]
            value = cut
        elif key == "tokenizer.ggml.merges":
            value = [m for m in value if all(part in kept for part in m.split(b" ", 1)) and m.replace(b" ", b"", 1) in kept][:400]
        out.append((key, vtype, value, element_type))
    return out


def gguf_seeds():
    for path in sorted((SHARED / "tokenizer-vectors").glob("*.gguf")):
        kvs, _ = read_gguf_kvs(path)
        put("gguf", f"vocab_{path.stem.replace('ggml-vocab-', '')}.gguf", gguf_bytes(shrink_vocab(kvs, 400), []))
    stories = SHARED / "models/stories260K-gguf/stories260K.gguf"
    if stories.exists():
        kvs, tensors = read_gguf_kvs(stories)
        tiny = [(name, [min(d, 4) for d in ne], 0) for name, ne, _ in tensors]
        put("gguf", "stories260K_tiny_tensors.gguf", gguf_bytes(kvs, tiny))
        quantized = [("q4_0", [32, 2], 2), ("q8_0", [64], 8), ("q4_k", [256, 1], 12), ("q6_k", [256], 14), ("bf16", [3, 2], 30),
                     ("i32", [5], 26), ("empty", [0, 7], 0)]
        arch = [kv for kv in kvs if not kv[0].startswith("tokenizer.")]
        put("gguf", "quantized_tensors.gguf", gguf_bytes(arch, quantized, alignment=64))
        put("gguf", "v2_alignment_1.gguf", gguf_bytes(arch + [("general.alignment", U32, 1, None)], tiny[:5], version=2, alignment=1))
    chat = ROOT / "tests/fixtures/chat/gguf/model.gguf"
    if chat.exists():
        put("gguf", "chat_template_vocab.gguf", chat.read_bytes())
    put("gguf", "every_value_type.gguf", gguf_bytes(
        [("u8", U8, 1, None), ("i8", I8, -1, None), ("u16", U16, 2, None), ("i16", I16, -2, None), ("u32", U32, 3, None),
         ("i32", I32, -3, None), ("f32", F32, 0.5, None), ("bool", BOOL, True, None), ("str", STRING, "text", None),
         ("u64", U64, 4, None), ("i64", I64, -4, None), ("f64", F64, 0.25, None), ("arr_f32", ARRAY, [1.0, 2.0], F32),
         ("arr_str", ARRAY, ["a", "b"], STRING)], [("t", [2, 2], 0)]))


# --- llama2.c ----------------------------------------------------------------------------------
def llama2c_checkpoint(version, dim=8, hidden=16, layers=2, heads=2, kv_heads=1, vocab=8, seq=4, shared=True, group=8):
    head = dim // heads
    kv_dim = head * kv_heads

    def f32(n):
        return RNG.standard_normal(n).astype("<f4").tobytes()

    def q80(n):
        return RNG.integers(-127, 128, n, dtype=np.int8).tobytes() + RNG.random(n // group).astype("<f4").tobytes()

    fields = [dim, hidden, layers, heads, kv_heads, vocab, seq]
    matrices = [dim * dim, kv_dim * dim, kv_dim * dim, dim * dim]
    ffn = [hidden * dim, dim * hidden, hidden * dim]
    if version == 0:
        if not shared:
            fields[5] = -vocab
        out = struct.pack("<7i", *fields) + f32(vocab * dim) + f32(layers * dim)
        out += b"".join(f32(layers * n) for n in matrices) + f32(layers * dim) + b"".join(f32(layers * n) for n in ffn)
        out += f32(dim) + f32(seq * head // 2) * 2
        if not shared:
            out += f32(vocab * dim)
        return out
    header = struct.pack("<Ii7iB", 0x616B3432, version, *fields, 1 if shared else 0)
    if version == 2:
        header += struct.pack("<i", group)
    header += b"\0" * (256 - len(header))
    matrix = q80 if version == 2 else f32
    out = header + f32(layers * dim) + f32(layers * dim) + f32(dim) + matrix(vocab * dim)
    out += b"".join(matrix(layers * n) for n in matrices) + b"".join(matrix(layers * n) for n in ffn)
    if not shared:
        out += matrix(vocab * dim)
    return out


def llama2c_seeds():
    put("llama2c", "v0_shared.bin", llama2c_checkpoint(0))
    put("llama2c", "v0_unshared.bin", llama2c_checkpoint(0, shared=False, layers=1))
    put("llama2c", "v1.bin", llama2c_checkpoint(1, layers=1))
    put("llama2c", "v2_group8_f32_fallback.bin", llama2c_checkpoint(2, layers=1, group=8))
    put("llama2c", "v2_group32_packed.bin", llama2c_checkpoint(2, dim=32, hidden=32, heads=4, kv_heads=2, layers=1, vocab=4, group=32, shared=False))


def tokenizer_bin(pieces, max_len=None):
    max_len = max_len or max(len(p) for p in pieces)
    out = struct.pack("<i", max_len)
    for i, piece in enumerate(pieces):
        out += struct.pack("<fi", -float(i), len(piece)) + piece
    return out


def read_tokenizer_bin(path, limit):
    raw = path.read_bytes()
    offset, pieces = 4, []
    while offset < len(raw) and len(pieces) < limit:
        _, length = struct.unpack_from("<fi", raw, offset)
        pieces.append(raw[offset + 8 : offset + 8 + length])
        offset += 8 + length
    return pieces


def llama2c_tokenizer_seeds():
    for path in [SHARED / "models/stories260K/tok512.bin", SHARED / "models/aidreams260K/tok512.bin"]:
        if path.exists():
            put("llama2c_tokenizer", f"{path.parent.name}_{path.name}", path.read_bytes())
    llama2 = SHARED / "models/llama2-tokenizer/tokenizer.bin"
    if llama2.exists():
        put("llama2c_tokenizer", "llama2_first400.bin", tokenizer_bin(read_tokenizer_bin(llama2, 400)))
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b"<0x%02X>" % b for b in range(256)] + [b" ", b"e", b"t", b" t", b"he", b" the", "é".encode()]
    put("llama2c_tokenizer", "minimal_265.bin", tokenizer_bin(pieces))


# --- HF tokenizer.json ---------------------------------------------------------------------------
def shrink_hf(tokenizer, keep):
    model = tokenizer["model"]
    vocab = {piece: i for piece, i in model["vocab"].items() if i < keep} if isinstance(model["vocab"], dict) else model["vocab"][:keep]
    model["vocab"] = vocab
    if "merges" in model:
        def parts(m):
            return m.split(" ", 1) if isinstance(m, str) else m
        model["merges"] = [m for m in model["merges"] if len(parts(m)) == 2 and all(p in vocab for p in parts(m)) and "".join(parts(m)) in vocab][:300]
    renumbered = {}
    added = []
    for token in tokenizer.get("added_tokens", [])[:8]:
        if token["id"] >= keep:
            renumbered[token["content"]] = keep + len(renumbered)
            token["id"] = renumbered[token["content"]]
        added.append(token)
    tokenizer["added_tokens"] = added

    def fix(node):
        if isinstance(node, dict):
            if "ids" in node and "id" in node and isinstance(node["ids"], list):
                node["ids"] = [renumbered.get(node["id"], i if i < keep else keep) for i in node["ids"]]
            for value in node.values():
                fix(value)
        elif isinstance(node, list):
            for value in node:
                fix(value)
    fix(tokenizer.get("post_processor"))
    return tokenizer


def hf_seeds():
    stories = SHARED / "models/stories260K-hf/tokenizer.json"
    if stories.exists():
        put("hf_tokenizer", "stories260K.json", stories.read_bytes())
        metaspace = json.loads(stories.read_text())
        metaspace["normalizer"] = None
        metaspace["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
        metaspace["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
        put("hf_tokenizer", "stories260K_metaspace.json", json.dumps(metaspace))
    for name in ["gpt2", "llama2", "llama3_1", "qwen3", "deepseek_v3"]:
        path = SHARED / f"models/{name}-tokenizer/tokenizer.json"
        if path.exists():
            put("hf_tokenizer", f"{name}_shrunk.json", json.dumps(shrink_hf(json.loads(path.read_text()), 300), ensure_ascii=False))
    wordpiece = {"normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True, "strip_accents": None, "lowercase": True},
                 "pre_tokenizer": {"type": "BertPreTokenizer"},
                 "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
                 "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
                 "added_tokens": [{"id": i, "content": c, "special": True, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
                                  for i, c in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"])],
                 "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
                           "vocab": {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "##s", "!", "1", "##2", "中", "caf", "##e"])}}}
    put("hf_tokenizer", "wordpiece_bert.json", json.dumps(wordpiece))
    put("hf_tokenizer", "unigram_refused.json", json.dumps({"model": {"type": "Unigram", "vocab": [["a", -1.0]]}}))
    unigram_seeds()


def shrink_unigram(tokenizer, keep, extra=()):
    """The first `keep` pieces (and those at `extra`), added tokens renumbered into them."""
    vocab = tokenizer["model"]["vocab"]
    kept = sorted(set(range(min(keep, len(vocab)))) | set(extra))
    renumber = {old: new for new, old in enumerate(kept)}
    tokenizer["model"]["vocab"] = [vocab[i] for i in kept]
    tokenizer["added_tokens"] = [dict(t, id=renumber[t["id"]]) for t in tokenizer.get("added_tokens", []) if t["id"] in renumber]

    def fix(node):
        if isinstance(node, dict):
            if "ids" in node and isinstance(node["ids"], list):
                node["ids"] = [renumber.get(i, 0) for i in node["ids"]]
            for value in node.values():
                fix(value)
        elif isinstance(node, list):
            for value in node:
                fix(value)
    fix(tokenizer.get("post_processor"))
    return tokenizer


def unigram_seeds():
    """Unigram models (tests/fixtures/tokenizer/unigram): ALBERT's Precompiled charsmap with NFKD,
    StripAccents, Lowercase and Replace; byte fallback with NFKC and Strip; T5's vocabulary with
    ALBERT's charsmap (T5's own is 240 KB)."""
    folder = ROOT / "tests/fixtures/tokenizer/unigram"
    albert = json.loads((folder / "albert/tokenizer.json").read_text())
    charsmap = next(n for n in albert["normalizer"]["normalizers"] if n["type"] == "Precompiled")
    put("hf_tokenizer", "unigram_albert.json", json.dumps(shrink_unigram(albert, 200), ensure_ascii=False))
    fallback = json.loads((folder / "byte_fallback/tokenizer.json").read_text())
    put("hf_tokenizer", "unigram_byte_fallback.json", json.dumps(shrink_unigram(fallback, 280), ensure_ascii=False))
    t5 = json.loads((folder / "t5/tokenizer.json").read_text())
    t5["normalizer"] = {"type": "Sequence", "normalizers": [charsmap, {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]}
    put("hf_tokenizer", "unigram_t5_charsmap.json", json.dumps(shrink_unigram(t5, 150), ensure_ascii=False))
    just_charsmap = {"normalizer": charsmap, "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": False,
                                                        "vocab": [["<unk>", 0.0], ["\u2581", -2.0], ["a", -3.0], ["b", -3.5], ["ab", -4.0]]}}
    put("hf_tokenizer", "unigram_charsmap_only.json", json.dumps(just_charsmap, ensure_ascii=False))


# --- grammars and step messages -------------------------------------------------------------------
def grammar_seeds():
    """One byte for the source (0 GBNF, 1 regex, 2 JSON schema), then its text."""
    gbnf = {
        "repetitions": r'root ::= "a" ( "b" | "cd" )* "e"? [0-9]{2,3}',
        "words": '# a list of words\nroot ::= word ("," ws word)*\nword ::= [a-z]+   # letters\nws ::= " "?\n',
        "string": r'root ::= "\"" [^"\\]* "\""',
        "classes": "root ::= [\u03b1-\u03c9]+ . [^\\x00-\\x7f] \"\\u00e9\\U0001F600\\x41\"",
        "json_like": 'root ::= obj\nobj ::= "{" ws ( pair ( "," ws pair )* )? "}"\npair ::= str ws ":" ws val\n'
                     'val ::= str | num | obj | "[" ws ( val ( "," ws val )* )? "]"\nstr ::= "\\"" [a-z]* "\\""\n'
                     'num ::= "-"? [0-9]+ ( "." [0-9]+ )?\nws ::= [ \\t\\n]{0,4}\n',
    }
    for name, text in gbnf.items():
        put("grammar", f"gbnf_{name}.txt", b"\x00" + text.encode())
    regexes = [r"^\d{3}-\d{4}$", r"[A-Z][a-z]+( [A-Z][a-z]+)*", r"(cat|dog)s?", r"\w+@\w+\.(com|org)", r"a.c",
               r"[^0-9\s]{2}", r"x{2,}y?", r"(?:ab)+?\.", r"\$\d+\.\d\d", r"(?P<year>\d{4})-(?<m>[01]\d)",
               "[\u00e9\x41-\x5a\t]+\\u4e2d|\\f\\v\\0"]
    for i, regex in enumerate(regexes):
        put("grammar", f"regex_{i}.txt", b"\x01" + regex.encode())
    schemas = {
        "object": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3}},
                   "required": ["name"], "additionalProperties": False},
        "defs": {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
                 "type": "object",
                 "properties": {"kind": {"enum": ["a", "b", 3, None]}, "v": {"const": "fixed"},
                                "p": {"anyOf": [{"$ref": "#/$defs/point"}, {"type": "null"}]},
                                "day": {"type": "string", "format": "date"}, "when": {"type": "string", "format": "date-time"},
                                "id": {"type": "string", "format": "uuid"}, "mail": {"type": "string", "format": "email"},
                                "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]$"},
                                "short": {"type": "string", "minLength": 1, "maxLength": 3}},
                 "required": ["kind", "v", "p", "day", "code", "short"]},
        "recursive": {"type": "object", "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#"}}},
                      "required": ["value", "children"]},
        "map": {"type": "object", "additionalProperties": {"type": ["number", "boolean", "null"]}},
        "allof": {"allOf": [{"type": "array", "items": {"definitions": {}, "type": "string"}}], "title": "t", "description": "d"},
        "unsupported": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}},
    }
    for name, schema in schemas.items():
        put("grammar", f"schema_{name}.json", b"\x02" + json.dumps(schema).encode())


def step_command_seeds():
    """Step messages as encode_step_call writes them (int32 words: "SFST", the call, its arguments)."""
    def words(*values):
        return struct.pack(f"<{len(values)}i", *values)
    magic = 0x53465354
    row = struct.unpack("<8i", struct.pack("<fifffiii", 0.7, 40, 0.9, 0.05, 1.1, 1234, 5, 0))
    put("step_command", "forward_last.bin", words(magic, 1, 0, 3, 11, 12, 13, 1, 3, 0, 1, 2, 7, 8, 0))
    put("step_command", "forward_sample.bin", words(magic, 2, 0, 2, 5, 6, 2, 1, 4, 1, 1, 3, 1, 0, 1, 1, 9, 2, *row, *row))
    put("step_command", "forward_sample_masked.bin", words(magic, 3, 0, 1, 42, 1, 1, 0, 1, 0, 1, *row))
    put("step_command", "forward_hidden_all.bin", words(magic, 4, 1, 2, 1, 2, 1, 2, 0, 1, 2, 3, 4, 0))
    put("step_command", "swap_blocks.bin", words(magic, 5, 1, 2, 3, 30, 4, 40))
    put("step_command", "warm_up.bin", words(magic, 6, 1))
    put("step_command", "stop.bin", words(magic, 7))


# --- chat templates and request bodies ------------------------------------------------------------
def chat_seeds():
    for path in sorted((ROOT / "tests/fixtures/chat/templates").glob("*.jinja")):
        put("chat_template", path.name, path.read_bytes())
    for name in ["llama3_1", "qwen3", "deepseek_v3", "llama2"]:
        path = SHARED / f"models/{name}-tokenizer/tokenizer_config.json"
        if path.exists():
            source = json.loads(path.read_text()).get("chat_template")
            if isinstance(source, str):
                put("chat_template", f"{name}.jinja", source)
    put("chat_template", "constructs.jinja",
        "{% macro m(x, y=2) %}{{ x ~ y }}{% endmacro %}{% set ns = namespace(n=0) %}"
        "{% for msg in messages if msg.role != 'tool' %}{% set ns.n = ns.n + 1 %}{{ loop.index }}:{{ m(msg.role) | upper }}"
        "{% if msg.content is string %}{{ msg.content | trim | replace('a', 'b') }}{% elif msg.content %}{{ msg.content | map(attribute='text') | join(',') }}{% endif %}"
        "{% endfor %}{{ ns.n }}{{ tools | tojson(indent=2) if tools }}{{ [1, 2, 3][1:] | list | length }}{{ {'a': 1}.items() | list }}"
        "{%- if add_generation_prompt %}{{ bos_token + 'go' + eos_token }}{% endif %}{{ raise_exception('x') if false }}")


def request_seeds():
    put("openai_request", "completion.json", json.dumps({"model": "m", "prompt": "Once upon", "max_tokens": 16, "temperature": 0.7,
        "top_p": 0.9, "top_k": 40, "n": 2, "stop": ["\n", "."], "stream": True, "stream_options": {"include_usage": True},
        "logprobs": 2, "seed": -5, "presence_penalty": 0.5, "frequency_penalty": -0.5, "stop_token_ids": [1, 2]}))
    put("openai_request", "completion_batch_ids.json", json.dumps({"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 1, "best_of": 1, "min_p": 0.1}))
    put("openai_request", "chat.json", json.dumps({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_completion_tokens": 8, "logprobs": True, "top_logprobs": 3,
        "chat_template_kwargs": {"enable_thinking": False}, "response_format": {"type": "text"}, "repetition_penalty": 1.1,
        "ignore_eos": False, "logit_bias": {}}))
    put("openai_request", "numbers_edge.json", '{"prompt": "x", "max_tokens": 1e999, "temperature": -1e999, "seed": 12345678901234567890123}')


def main():
    for seeds in [safetensors_seeds, gguf_seeds, llama2c_seeds, llama2c_tokenizer_seeds, hf_seeds, chat_seeds, request_seeds,
                  grammar_seeds, step_command_seeds]:
        seeds()
    total = sum(f.stat().st_size for f in CORPUS.rglob("*") if f.is_file())
    print(f"seed corpora: {sum(1 for f in CORPUS.rglob('*') if f.is_file())} files, {total} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
