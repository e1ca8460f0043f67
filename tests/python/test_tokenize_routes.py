#!/usr/bin/env python3
"""POST /tokenize and /detokenize of `splitflow serve` against HF `tokenizers` (llama.cpp's server
format: {"content", "add_special", "with_pieces"} -> {"tokens"}; {"tokens"} -> {"content"}).

Starts the server on stories260K-hf and checks, for every line of the tokenizer corpus fixture:
ids equal to tokenizers' encode (with and without special tokens), detokenize equal to its
decode (special tokens kept), and the with_pieces pieces joining back to the text's bytes; then the
400s of bad bodies and the API key. Exit status 77 (skipped) without `tokenizers` or the model.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

KEY = "tokenize-test-key"


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def post(base, path, body, key=KEY):
    request = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--splitflow", required=True)
    parser.add_argument("--shared", required=True)
    parser.add_argument("--corpus", required=True)
    args = parser.parse_args()
    try:
        from tokenizers import Tokenizer
    except ImportError:
        print("SKIP: the `tokenizers` package is not installed")
        return 77
    model = os.path.join(args.shared, "models/stories260K-hf")
    if not os.path.isdir(model):
        print(f"SKIP: {model} is missing")
        return 77
    reference = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    texts = [json.loads(line) for line in open(args.corpus, encoding="utf-8") if line.strip()]  # a JSON string a line

    server = subprocess.Popen([args.splitflow, "serve", "--model", model, "--port", "0", "--api-key", KEY,
                               "--no-warmup"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        deadline = time.time() + 120
        while port is None and time.time() < deadline:
            line = server.stderr.readline()
            if not line:
                fail(f"the server exited ({server.wait()}) before listening")
            match = re.search(r"on http://[\d.]+:(\d+)", line)
            if match:
                port = int(match.group(1))
        threading.Thread(target=lambda: server.stderr.read(), daemon=True).start()
        base = f"http://127.0.0.1:{port}"

        for text in texts:
            for add_special in (False, True):
                status, body = post(base, "/tokenize", {"content": text, "add_special": add_special})
                expected = reference.encode(text, add_special_tokens=add_special).ids
                if status != 200 or body["tokens"] != expected:
                    fail(f"/tokenize {text!r} add_special={add_special}: {status} {body}, tokenizers gives {expected}")
                status, body = post(base, "/detokenize", {"tokens": expected})
                decoded = reference.decode(expected, skip_special_tokens=False)
                if status != 200 or body["content"] != decoded:
                    fail(f"/detokenize {expected}: {status} {body}, tokenizers gives {decoded!r}")
            status, body = post(base, "/tokenize", {"content": text, "with_pieces": True})
            joined = b"".join(piece["piece"].encode() if isinstance(piece["piece"], str) else bytes(piece["piece"])
                              for piece in body["tokens"])
            if [piece["id"] for piece in body["tokens"]] != reference.encode(text, add_special_tokens=False).ids:
                fail(f"/tokenize with_pieces {text!r}: ids differ from tokenizers")
            # tokenizers' own pieces: "▁" is a space, "<0xNN>" a byte of a character the vocabulary lacks.
            expected_bytes = b"".join(
                bytes([int(piece[3:5], 16)]) if re.fullmatch(r"<0x[0-9A-F]{2}>", piece) else
                piece.replace("\u2581", " ").encode() for piece in reference.encode(text, add_special_tokens=False).tokens)
            if joined != expected_bytes:
                fail(f"/tokenize with_pieces {text!r}: pieces join to {joined!r}, tokenizers' to {expected_bytes!r}")
        print(f"{len(texts)} texts: /tokenize and /detokenize equal HF tokenizers (with and without special tokens)")

        for path, body, param in [("/tokenize", {}, "content"), ("/tokenize", {"content": 1}, "content"),
                                  ("/tokenize", {"content": "a", "add_special": "no"}, "add_special"),
                                  ("/detokenize", {"tokens": [1, 99999]}, "tokens[1]"),
                                  ("/detokenize", {"tokens": "1"}, "tokens")]:
            status, answer = post(base, path, body)
            if status != 400 or answer["error"]["param"] != param:
                fail(f"{path} {body}: {status} {answer}, expected a 400 naming {param}")
        status, answer = post(base, "/tokenize", {"content": "a"}, key="wrong")
        if status != 401:
            fail(f"/tokenize with a wrong key: {status} {answer}")
        request = urllib.request.Request(f"{base}/tokenize", data=b"{not json",
                                         headers={"Authorization": f"Bearer {KEY}"})
        try:
            urllib.request.urlopen(request, timeout=30)
            fail("/tokenize took a body that is not JSON")
        except urllib.error.HTTPError as error:
            if error.code != 400:
                fail(f"/tokenize with a body that is not JSON: {error.code}")
        print("PASS: bad bodies get 400s naming the field; a wrong key gets 401")
        return 0
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    sys.exit(main())
