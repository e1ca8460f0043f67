#!/usr/bin/env python3
"""`splitflow quantize` against the `gguf` package: the GGUF it writes from the real SmolLM2 Q4_1
file reads back in gguf.GGUFReader with the input's metadata (file type updated) and, for every
type the package can quantize (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), each 2-D weight byte-identical to
gguf.quants.quantize(gguf.quants.dequantize(input)); 1-D tensors copied as they were. A file in
one of splitflow's own types (q4_b32) loads back in splitflow and generates.
Exit 77 (skipped) without the gguf package or the model cache (scripts/fetch_models.py)."""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
    from gguf import quants
except ImportError as error:
    print(f"skipped: {error}")
    sys.exit(77)

TYPES = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1", "q5_0": "Q5_0", "q5_1": "Q5_1"}
FILE_TYPES = {"q8_0": 7, "q4_0": 2, "q4_1": 3, "q5_0": 8, "q5_1": 9}


def field_value(field):
    return field.contents()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--splitflow", required=True)
    parser.add_argument("--cache", default=os.environ.get(
        "SPLITFLOW_MODEL_CACHE", str(pathlib.Path(__file__).resolve().parents[2] / ".cache" / "models")))
    parser.add_argument("--types", nargs="*", default=list(TYPES))
    args = parser.parse_args()
    model = pathlib.Path(args.cache) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not model.exists():
        print(f"skipped: {model} is missing (scripts/fetch_models.py fetches it)")
        return 77
    source = gguf.GGUFReader(str(model))
    source_tensors = {t.name: t for t in source.tensors}
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.types:
            out = pathlib.Path(tmp) / f"{name}.gguf"
            subprocess.run([args.splitflow, "quantize", "--model", str(model), "--type", name, "--out", str(out)],
                           check=True, stdout=subprocess.DEVNULL)
            written = gguf.GGUFReader(str(out))
            for key, field in source.fields.items():
                if key.startswith("GGUF."):
                    continue
                got = written.fields.get(key)
                if got is None:
                    failures.append(f"{name}: key {key} missing")
                elif key == "general.file_type":
                    if field_value(got) != FILE_TYPES[name]:
                        failures.append(f"{name}: general.file_type {field_value(got)}")
                elif field_value(got) != field_value(field):
                    failures.append(f"{name}: key {key} differs")
            qtype = gguf.GGMLQuantizationType[TYPES[name]]
            for tensor in written.tensors:
                original = source_tensors[tensor.name]
                if len(original.shape) == 2:
                    f32 = quants.dequantize(original.data, original.tensor_type)
                    expected = quants.quantize(f32, qtype)
                    if tensor.tensor_type != qtype:
                        failures.append(f"{name}: {tensor.name} is {tensor.tensor_type.name}")
                    elif not np.array_equal(np.asarray(tensor.data).view(np.uint8).reshape(-1),
                                            np.asarray(expected).view(np.uint8).reshape(-1)):
                        failures.append(f"{name}: {tensor.name} differs from gguf.quants.quantize")
                elif not np.array_equal(np.asarray(tensor.data), np.asarray(original.data)):
                    failures.append(f"{name}: {tensor.name} (1-D) was changed")
            print(f"{name}: {len(written.tensors)} tensors checked", flush=True)

        own = pathlib.Path(tmp) / "q4_b32.gguf"
        subprocess.run([args.splitflow, "quantize", "--model", str(model), "--type", "q4_b32", "--out", str(own)],
                       check=True, stdout=subprocess.DEVNULL)
        run = subprocess.run([args.splitflow, "generate", "--model", str(own), "--prompt", "The capital of France is",
                              "--max-tokens", "8", "--temperature", "0"], capture_output=True, text=True)
        if run.returncode != 0 or not run.stdout.strip():
            failures.append(f"q4_b32: generate failed: {run.stderr[-500:]}")
    for failure in failures[:20]:
        print("FAIL", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
