#!/usr/bin/env python3
"""KV transfer timings on the CPU backend (issue 27): a prompt and a token instance and, for
reference, a mixed one (`splitflow serve --role ...`), one request at a time with prompts of
token ids of several lengths, layer-wise and serialized. Prints, per case, the request's wall time
through prompt + token (the prompt's KV computed on one process, moved over TCP, the last token
and one sampled token on the other) against the mixed instance's, and the prompt instance's own
figures (/splitwise/info): prompt compute, last row written, the visible part, bytes.

  python3 bench/splitwise_cpu.py --binary build-h27/splitflow --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse, json, os, re, signal, subprocess, sys, tempfile, time, urllib.request


def start(binary, model, role, extra):
    log = tempfile.NamedTemporaryFile(prefix=f"sw_{role}_", suffix=".log", delete=False)
    args = [binary, "serve", "--model", model, "--port", "0", "--kv-port", "0", "--role", role, "--no-warmup",
            "--max-batch-tokens", "2048", "--max-seqs", "8", "--num-blocks", "512"] + extra
    proc = subprocess.Popen(args, stderr=log, stdout=subprocess.DEVNULL)
    for _ in range(1200):
        text = open(log.name).read()
        match = re.search(r"on http://127\.0\.0\.1:(\d+)", text)
        if match:
            return proc, f"http://127.0.0.1:{match.group(1)}"
        if proc.poll() is not None:
            sys.exit(f"{role} instance failed:\n{text}")
        time.sleep(0.1)
    sys.exit(f"{role} instance did not start")


def post(url, body):
    request = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.loads(response.read())
    return time.perf_counter() - start, answer


def info(url):
    with urllib.request.urlopen(url + "/splitwise/info", timeout=10) as response:
        return json.loads(response.read())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default="build/splitflow")
    parser.add_argument("--model", required=True)
    parser.add_argument("--lengths", default="128,512,1024,2000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", default="")
    args = parser.parse_args()
    extra = ["--threads", args.threads] if args.threads else []
    procs = []
    try:
        prompt, prompt_url = start(args.binary, args.model, "prompt", extra)
        procs.append(prompt)
        token, token_url = start(args.binary, args.model, "token", extra)
        procs.append(token)
        mixed, mixed_url = start(args.binary, args.model, "mixed", extra)
        procs.append(mixed)
        kv = info(prompt_url)["kv_address"]
        print(f"model {args.model}; KV layout {info(prompt_url)['layout']}")
        print("| prompt tokens | mode | bytes moved | prompt compute ms | last row written ms | visible ms | "
              "prompt+token request ms | mixed request ms |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for length in [int(x) for x in args.lengths.split(",")]:
            for m, mode in enumerate(["layerwise", "serialized"]):
                rows = []
                for r in range(args.repeats):
                    ids = [(1000 + 37 * i + 101 * r + 7 * length + 5003 * m) % 30000 + 10 for i in range(length)]  # no prefix-cache hits
                    body = {"prompt": ids, "max_tokens": 1, "temperature": 0, "ignore_eos": True}
                    split_s, split_answer = post(token_url, dict(body, splitflow={"kv_source": f"{mode}@{kv}", "return_token_ids": True}))
                    stats = info(prompt_url)["transfers"]
                    mixed_s, mixed_answer = post(mixed_url, dict(body, splitflow={"return_token_ids": True}))
                    assert split_answer["choices"][0]["token_ids"] == mixed_answer["choices"][0]["token_ids"], "outputs differ"
                    rows.append((stats["last_prompt_compute_ms"], stats["last_sent_ms"], stats["last_visible_ms"],
                                 split_s * 1000, mixed_s * 1000))
                rows.sort(key=lambda row: row[3])
                median = rows[len(rows) // 2]
                bytes_moved = (length - 1) * 2 * int(re.match(r"(\d+) layers x (\d+) kv heads x (\d+)", info(prompt_url)["layout"]).group(1)) \
                    * int(re.match(r"(\d+) layers x (\d+) kv heads x (\d+)", info(prompt_url)["layout"]).group(2)) \
                    * int(re.match(r"(\d+) layers x (\d+) kv heads x (\d+)", info(prompt_url)["layout"]).group(3)) * 4
                print(f"| {length} | {mode} | {bytes_moved / 1e6:.1f} MB | {median[0]:.1f} | {median[1]:.1f} | {median[2]:.2f} | "
                      f"{median[3]:.1f} | {median[4]:.1f} |")
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait()


if __name__ == "__main__":
    main()
