#!/usr/bin/env python3
"""Fixtures for tests/formats/pickle_test.cpp: PyTorch checkpoints written by torch.save, the values
torch.load(weights_only=True) reads back from them, and malicious pickles.

    python3 python/make_pickle_fixtures.py [--out tests/fixtures/pickle]
    python3 python/make_pickle_fixtures.py --convert-model SRC_DIR DST_ROOT

Fixture mode (run by hand after changing it; the outputs are committed, every file < 50 KB; the
tensors come from a seeded torch.Generator, so reruns give the same values):
  - <name>.pt, one per layout: zip (torch >= 1.6, pickle protocol 2), zip with pickle protocol 5
    (STACK_GLOBAL, FRAME, MEMOIZE), legacy non-zip (_use_new_zipfile_serialization=False), and a
    nested training-style checkpoint (dicts, lists, tuples, scalars); sharded/ holds two shards and
    pytorch_model.bin.index.json as transformers writes them. The state dict covers f32, f16, bf16,
    f64, the integer types and bool, a 0-dim and an empty tensor, an nn.Parameter, a view with a
    storage offset, non-contiguous views (a transpose, a step slice) and storages shared by several
    tensors.
  - expected/<name>.safetensors: torch.load(<name>.pt, weights_only=True) (weights_only=False for
    protocol 5, whose FRAME opcode torch's weights_only unpickler lacks), flattened with '.'
    between nested keys and made contiguous, after checking it equals the tensors that were saved;
    expected/<name>.json: its non-tensor values.
  - malicious/*.pt and malicious/index.json: checkpoints whose pickle names a forbidden global (or
    abuses REDUCE / BUILD / INST / OBJ / NEWOBJ / BINPERSID); index.json gives for each the text
    splitflow's error must contain and, for the live payloads, the marker file the payload creates.
    Every live payload is proven live here: torch.load(weights_only=False) in a subprocess creates
    its marker (which is then removed).
  - fuzz/corpus/pickle/: seeds for fuzz/fuzz_pickle.cpp (copies of the above and bare object pickles).

--convert-model: writes DST_ROOT/{zip,legacy,sharded}/, each a copy of the HF directory SRC_DIR
(config.json, tokenizer files) with model.safetensors converted to pytorch_model.bin (sharded: two
shards and the index). The model-level test runs this at test time. Exit status 77 when torch or
safetensors is missing.
"""

import argparse
import io
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path

try:
    import torch
    from safetensors.torch import load_file, save_file
except ImportError as error:  # the test harness reports 77 as "skipped"
    print(f"make_pickle_fixtures.py: {error}", file=sys.stderr)
    sys.exit(77)

MARKER_DIR = "/tmp"


def marker_path(name):
    return f"{MARKER_DIR}/splitflow-pickle-payload-ran-{name}"


# ---- the state dicts ------------------------------------------------------------------------------

def state_dict():
    g = torch.Generator().manual_seed(28)
    sd = OrderedDict()
    sd["f32"] = torch.randn(3, 4, generator=g)
    sd["f16"] = torch.randn(5, generator=g).half()
    sd["bf16"] = torch.randn(2, 3, generator=g).bfloat16()
    sd["f64"] = torch.randn(2, generator=g).double()
    sd["i64"] = torch.tensor([-(2 ** 40), -1, 0, 7], dtype=torch.int64)
    sd["i32"] = torch.tensor([-5, 2 ** 30], dtype=torch.int32)
    sd["i16"] = torch.tensor([-300, 300], dtype=torch.int16)
    sd["i8"] = torch.tensor([-128, 127, 3], dtype=torch.int8)
    sd["u8"] = torch.tensor([0, 255, 9], dtype=torch.uint8)
    sd["bool"] = torch.tensor([True, False, True])
    sd["scalar"] = torch.tensor(2.5)
    sd["empty"] = torch.zeros(0, 3)
    sd["param"] = torch.nn.Parameter(torch.randn(2, 2, generator=g), requires_grad=False)
    base = torch.randn(4, 5, generator=g)
    sd["base"] = base
    sd["rows_1_to_3"] = base[1:3]        # storage_offset 5, contiguous: a view into base's bytes
    sd["transposed"] = base.t()          # strides (1, 5): materialized by splitflow
    sd["every_other_column"] = base[:, ::2]  # strides (5, 2)
    sd["last_column"] = base[:, 4]       # storage_offset 4, stride (5,)
    tied = torch.randn(3, 2, generator=g)
    sd["tied.a"] = tied                  # the same tensor twice: one storage, one memo entry
    sd["tied.b"] = tied
    half_base = torch.randn(6, generator=g).half()
    sd["half_pieces.0"] = half_base[:3]  # two views of one f16 storage
    sd["half_pieces.1"] = half_base[3:]
    return sd


def nested_checkpoint():
    g = torch.Generator().manual_seed(29)
    return {
        "model": OrderedDict([("w", torch.randn(2, 3, generator=g)), ("b", torch.randn(3, generator=g).bfloat16())]),
        "layers": [torch.arange(4, dtype=torch.float32), (torch.ones(2, dtype=torch.float16), 5)],
        "epoch": 3,
        "lr": 0.25,
        "name": "run-\u00e9",
        "done": True,
        "nothing": None,
        7: torch.tensor([1, 2], dtype=torch.int64),
    }


def flatten(value, prefix, tensors, scalars):
    join = (lambda key: f"{prefix}.{key}" if prefix else str(key))
    if isinstance(value, torch.Tensor):
        tensors[prefix] = value
    elif isinstance(value, dict):
        for key, item in value.items():
            flatten(item, join(key), tensors, scalars)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            flatten(item, join(index), tensors, scalars)
    else:
        scalars[prefix] = value


def check_same(saved, loaded, what):
    saved_tensors, saved_scalars, loaded_tensors, loaded_scalars = {}, {}, {}, {}
    flatten(saved, "", saved_tensors, saved_scalars)
    flatten(loaded, "", loaded_tensors, loaded_scalars)
    assert list(saved_tensors) == list(loaded_tensors), what
    for name, tensor in saved_tensors.items():
        other = loaded_tensors[name]
        assert tensor.dtype == other.dtype and tensor.shape == other.shape, (what, name)
        assert torch.equal(tensor.detach(), other.detach()), (what, name)
    assert saved_scalars == loaded_scalars, what
    return loaded_tensors, loaded_scalars


def write_expected(out, name, checkpoint_path, saved):
    # torch's weights_only unpickler has no FRAME opcode (protocol >= 4); we wrote that file ourselves.
    loaded = torch.load(checkpoint_path, weights_only=name != "zip_protocol5")
    tensors, scalars = check_same(saved, loaded, name)
    (out / "expected").mkdir(exist_ok=True)
    save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()}, str(out / "expected" / f"{name}.safetensors"))
    (out / "expected" / f"{name}.json").write_text(json.dumps({"tensors": list(tensors), "metadata": scalars}, indent=1) + "\n")


def save_sharded(sd, directory, prefix="pytorch_model"):
    """Two shards and the index, as transformers' save_pretrained(safe_serialization=False) writes them."""
    directory.mkdir(parents=True, exist_ok=True)
    names = list(sd)
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map, total = {}, 0
    for i, half in enumerate(halves):
        shard = f"{prefix}-{i + 1:05d}-of-00002.bin"
        torch.save(OrderedDict((n, sd[n]) for n in half), directory / shard)
        for n in half:
            weight_map[n] = shard
            total += sd[n].numel() * sd[n].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / f"{prefix}.bin.index.json").write_text(json.dumps(index, indent=2) + "\n")


# ---- malicious pickles ----------------------------------------------------------------------------
# A tiny assembler for the hand-made ones (opcode bytes as in CPython's Lib/pickle.py).

PROTO2 = b"\x80\x02"
MARK, STOP, TUPLE, REDUCE, BUILD, EMPTY_TUPLE, EMPTY_DICT = b"(", b".", b"t", b"R", b"b", b")", b"}"
SETITEMS, SETITEM, BINPERSID, NEWOBJ, NEWFALSE, OBJ = b"u", b"s", b"Q", b"\x81", b"\x89", b"o"


def GLOBAL(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def INST(module, name):
    return b"i" + module.encode() + b"\n" + name.encode() + b"\n"


def STR(text):
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def INT(value):
    return b"J" + struct.pack("<i", value)


def call(function, *args):
    """function(*args) through REDUCE."""
    return function + MARK + b"".join(args) + TUPLE + REDUCE


def ordered_dict(*pairs):
    return call(GLOBAL("collections", "OrderedDict")) + MARK + b"".join(k + v for k, v in pairs) + SETITEMS


def storage_pid(type_global=GLOBAL("torch", "FloatStorage"), key=STR("0"), numel=INT(4)):
    return MARK + STR("storage") + type_global + key + STR("cpu") + numel + TUPLE + BINPERSID


def rebuild(storage=None, offset=INT(0), size=MARK + INT(4) + TUPLE, stride=MARK + INT(1) + TUPLE):
    storage = storage if storage is not None else storage_pid()
    return call(GLOBAL("torch._utils", "_rebuild_tensor_v2"), storage, offset, size, stride, NEWFALSE,
                call(GLOBAL("collections", "OrderedDict")))


def state_dict_pickle(value):
    return PROTO2 + ordered_dict((STR("w"), value)) + STOP


class Reduce:
    """pickle.dumps(Reduce(f, args)) is the classic payload: unpickling calls f(*args)."""

    def __init__(self, function, args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def malicious_pickles():
    """name -> (pickle bytes, text the error must contain, marker the payload creates or None)."""
    touch = lambda name: f"touch {marker_path(name)}"
    write = lambda name: f"open({marker_path(name)!r}, 'w').write('ran')"
    cases = {}
    # Live payloads, pickled by Python's own pickler (os.system pickles as posix.system on Linux).
    cases["os_system"] = (pickle.dumps(Reduce(os.system, (touch("os_system"),)), protocol=2), "posix.system", "os_system")
    # Protocol 2 writes Python 2's module names (pickle's fix_imports): the refusal names what the file says.
    cases["builtins_eval"] = (pickle.dumps(Reduce(eval, (f"__import__('os').system({touch('builtins_eval')!r})",)), protocol=2),
                              "__builtin__.eval", "builtins_eval")
    cases["builtins_exec"] = (pickle.dumps(Reduce(exec, (write("builtins_exec"),)), protocol=4), "builtins.exec", "builtins_exec")
    cases["subprocess_popen"] = (pickle.dumps(Reduce(subprocess.Popen, (["touch", marker_path("subprocess_popen")],)), protocol=2),
                                 "commands.Popen", "subprocess_popen")
    # The payload as a tensor's value inside an otherwise valid state dict (nested REDUCE).
    cases["reduce_in_state_dict"] = (
        PROTO2 + ordered_dict((STR("w"), call(GLOBAL("os", "system"), STR(touch("reduce_in_state_dict"))))) + STOP,
        "os.system", "reduce_in_state_dict")
    cases["reduce_in_tensor_args"] = (
        state_dict_pickle(rebuild(offset=call(GLOBAL("builtins", "eval"), STR(f"__import__('os').system({touch('reduce_in_tensor_args')!r}) or 0")))),
        "builtins.eval", "reduce_in_tensor_args")
    cases["inst_os_system"] = (PROTO2 + MARK + STR(touch("inst_os_system")) + INST("os", "system") + STOP, "os.system",
                               "inst_os_system")
    cases["obj_builtins_exec"] = (PROTO2 + MARK + GLOBAL("builtins", "exec") + STR(write("obj_builtins_exec")) + OBJ + STOP,
                                  "builtins.exec", "obj_builtins_exec")
    # BUILD: __setstate__ smuggled in a state dict, and BUILD on objects that are not dicts.
    cases["build_setstate"] = (
        PROTO2 + call(GLOBAL("collections", "OrderedDict")) + EMPTY_DICT + STR("__setstate__") + GLOBAL("posix", "system")
        + SETITEM + BUILD + STOP, "posix.system", None)
    cases["build_on_tensor"] = (
        state_dict_pickle(rebuild() + EMPTY_DICT + STR("__class__") + STR("x") + SETITEM + BUILD), "BUILD on a tensor", None)
    cases["build_on_global"] = (
        PROTO2 + GLOBAL("torch._utils", "_rebuild_tensor_v2") + EMPTY_DICT + BUILD + STOP, "BUILD on a global", None)
    # Globals hidden in a persistent id.
    cases["global_in_persistent_id"] = (state_dict_pickle(rebuild(storage_pid(type_global=GLOBAL("os", "system")))),
                                        "os.system", None)
    cases["reduce_in_persistent_id"] = (
        state_dict_pickle(rebuild(storage_pid(key=call(GLOBAL("builtins", "getattr"), STR("a"), STR("b"))))),
        "builtins.getattr", None)
    cases["persistent_id_not_a_tuple"] = (state_dict_pickle(rebuild(STR("0") + BINPERSID)), "persistent id is a str", None)
    cases["persistent_id_wrong_tag"] = (
        state_dict_pickle(rebuild(MARK + STR("module") + GLOBAL("torch", "FloatStorage") + STR("0") + STR("cpu") + INT(4)
                                  + TUPLE + BINPERSID)), "does not start with 'storage'", None)
    # Callables a checkpoint may name, misused.
    cases["storage_type_called"] = (PROTO2 + call(GLOBAL("torch", "FloatStorage")) + STOP, "calls a torch storage type", None)
    cases["newobj_on_function"] = (PROTO2 + GLOBAL("torch._utils", "_rebuild_tensor_v2") + EMPTY_TUPLE + NEWOBJ + STOP,
                                   "NEWOBJ on torch._utils._rebuild_tensor_v2", None)
    cases["reduce_on_string"] = (PROTO2 + STR("os.system") + EMPTY_TUPLE + REDUCE + STOP, "calls a str", None)
    # Well-known gadgets other loaders have been caught by.
    cases["torch_load_from_bytes"] = (PROTO2 + call(GLOBAL("torch.storage", "_load_from_bytes"), b"C\x00") + STOP,
                                      "torch.storage._load_from_bytes", None)
    cases["numpy_reconstruct"] = (PROTO2 + call(GLOBAL("numpy.core.multiarray", "_reconstruct")) + STOP,
                                  "numpy.core.multiarray._reconstruct", None)
    cases["python2_builtin_eval"] = (PROTO2 + call(GLOBAL("__builtin__", "eval"), STR("1")) + STOP, "__builtin__.eval", None)
    cases["ext1_registry"] = (PROTO2 + b"\x82\x01" + STOP, "EXT1", None)
    # A whole module pickled (torch.save(model)): its class is refused by name.
    buffer = io.BytesIO()
    torch.save(torch.nn.Linear(2, 2), buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as archive:
        module_pickle = archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")))
    cases["whole_module"] = (module_pickle, "torch.nn.modules.linear.Linear", None)
    return cases


def zip_with_pickle(data_pkl):
    """A torch.save zip whose data.pkl is replaced (every other entry as torch wrote it)."""
    buffer = io.BytesIO()
    torch.save(OrderedDict(w=torch.arange(4, dtype=torch.float32)), buffer)
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            target.writestr(info.filename.replace(info.filename.split("/")[0], "archive", 1),
                            data_pkl if info.filename.endswith("/data.pkl") else source.read(info))
    return out.getvalue()


def legacy_with_pickle(data_pkl):
    """The legacy layout with `data_pkl` as its object pickle and storage key "0" (4 x f32)."""
    header = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) + pickle.dumps(1001, protocol=2)
    header += pickle.dumps({"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}},
                           protocol=2)
    return header + data_pkl + pickle.dumps(["0"], protocol=2) + struct.pack("<q", 4) + struct.pack("<4f", 0, 1, 2, 3)


def prove_live(path, marker):
    if os.path.exists(marker):
        os.remove(marker)
    code = f"import torch\ntry:\n torch.load({str(path)!r}, weights_only=False)\nexcept Exception:\n pass\n"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)
    subprocess.run(["sleep", "0.5"])  # Popen payloads run asynchronously
    assert os.path.exists(marker), f"the payload of {path} did not run under torch.load(weights_only=False)"
    os.remove(marker)


def write_malicious(out):
    directory = out / "malicious"
    directory.mkdir(exist_ok=True)
    index = {}
    for name, (payload, refused, marker_name) in malicious_pickles().items():
        layouts = [("", zip_with_pickle)]
        if marker_name in ("os_system", "builtins_eval"):
            layouts.append(("legacy_", legacy_with_pickle))
        for prefix, wrap in layouts:
            path = directory / f"{prefix}{name}.pt"
            path.write_bytes(wrap(payload))
            marker = marker_path(marker_name) if marker_name else None
            if marker:
                prove_live(path, marker)
            try:  # torch's own safe loader does not load it either
                torch.load(path, weights_only=True)
            except Exception:
                pass
            else:
                raise AssertionError(f"torch.load(weights_only=True) accepted {path}")
            index[path.name] = {"refused": refused, "marker": marker}
    (directory / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")


def write_fuzz_seeds(fixtures, corpus):
    """fuzz/fuzz_pickle.cpp's seeds: every layout, a few attacks, and bare object pickles."""
    corpus.mkdir(parents=True, exist_ok=True)
    for name in ("zip.pt", "zip_protocol5.pt", "legacy.pt", "nested.pt", "sharded/pytorch_model-00001-of-00002.bin",
                 "malicious/reduce_in_tensor_args.pt", "malicious/build_on_tensor.pt", "malicious/legacy_os_system.pt"):
        shutil.copy(fixtures / name, corpus / Path(name).name)
    for name in ("zip.pt", "zip_protocol5.pt", "nested.pt"):
        with zipfile.ZipFile(fixtures / name) as archive:
            data_pkl = archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")))
        (corpus / f"{Path(name).stem}.data.pkl").write_bytes(data_pkl)


# ---- main -----------------------------------------------------------------------------------------

def make_fixtures(out):
    out.mkdir(parents=True, exist_ok=True)
    sd = state_dict()
    layouts = {
        "zip": lambda path: torch.save(sd, path),
        "zip_protocol5": lambda path: torch.save(sd, path, pickle_protocol=5),
        "legacy": lambda path: torch.save(sd, path, _use_new_zipfile_serialization=False),
    }
    for name, save in layouts.items():
        save(out / f"{name}.pt")
        write_expected(out, name, out / f"{name}.pt", sd)
    nested = nested_checkpoint()
    torch.save(nested, out / "nested.pt")
    write_expected(out, "nested", out / "nested.pt", nested)

    sharded = out / "sharded"
    plain = OrderedDict((k, v.detach().clone()) for k, v in sd.items() if k not in ("empty",))
    save_sharded(plain, sharded)
    merged = OrderedDict()
    for shard in sorted(sharded.glob("*.bin")):
        merged.update(torch.load(shard, weights_only=True))
    merged = OrderedDict((k, merged[k]) for k in plain)
    tensors, _ = check_same(plain, merged, "sharded")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "expected" / "sharded.safetensors"))
    write_malicious(out)
    write_fuzz_seeds(out, Path(__file__).resolve().parent.parent / "fuzz/corpus/pickle")
    for path in sorted(out.rglob("*")):
        if path.is_file():
            assert path.stat().st_size < 50_000, f"{path} is {path.stat().st_size} bytes (fixtures stay under 50 KB)"


def convert_model(source, destination_root):
    sd = load_file(str(source / "model.safetensors"))
    for layout in ("zip", "legacy", "sharded"):
        destination = destination_root / layout
        destination.mkdir(parents=True, exist_ok=True)
        for path in source.iterdir():
            if path.is_file() and path.suffix != ".safetensors" and not path.name.endswith(".index.json"):
                shutil.copy(path, destination / path.name)
        if layout == "zip":
            torch.save(sd, destination / "pytorch_model.bin")
        elif layout == "legacy":
            torch.save(sd, destination / "pytorch_model.bin", _use_new_zipfile_serialization=False)
        else:
            save_sharded(sd, destination)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests/fixtures/pickle")
    parser.add_argument("--convert-model", nargs=2, type=Path, metavar=("SRC_DIR", "DST_ROOT"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.convert_model:
        convert_model(*args.convert_model)
    else:
        make_fixtures(args.out)


if __name__ == "__main__":
    main()
