#!/usr/bin/env python3
"""Fault injection under load (issue 27): two prompt and two token instances behind
`splitflow route`, clients streaming greedy requests without pause, and an injector that every
--interval seconds kills one instance with SIGKILL (restarted on the same ports half a second
later) or stops it with SIGSTOP for --stop-seconds (a stalled transfer or stream), never a whole
pool at once. Every answer is compared with a mixed instance's answer to the same request (token
ids and text). Prints the counts: requests sent, finished equal to the reference, finished
different, failed, and the injections by kind, with the router's own counts.

  python3 bench/splitwise_faults.py --binary build/splitflow --model ../shared/models/stories260K-hf --injections 100
"""
import argparse, http.client, json, random, re, signal, socket, subprocess, sys, tempfile, threading, time, urllib.request

PROMPTS = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun.",
    "Tom had a big red ball.",
    "The sun was shining and the birds were singing in the tall green trees. A little dog",
    "One day, a bird",
    "Lily and her mom went to the park. They saw a big slide and",
]
LENGTHS = [40, 120, 300]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Instance:
    def __init__(self, binary, args, name):
        self.binary, self.args, self.name = binary, args, name
        self.proc = None
        self.start()

    def start(self):
        self.log = tempfile.NamedTemporaryFile(prefix=f"sw_{self.name}_", suffix=".log", delete=False)
        self.proc = subprocess.Popen([self.binary] + self.args, stderr=self.log, stdout=subprocess.DEVNULL)
        for _ in range(600):
            if re.search(r"on http://127\.0\.0\.1:\d+", open(self.log.name).read()):
                return
            if self.proc.poll() is not None:
                sys.exit(f"{self.name} failed to start:\n{open(self.log.name).read()}")
            time.sleep(0.05)
        sys.exit(f"{self.name} did not start")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def stream(port, body, timeout=300):
    body = dict(body, stream=True, splitflow={"return_token_ids": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        return None, None, f"HTTP {response.status}: {response.read()[:200]!r}"
    ids, text, error, done, pending = [], "", None, False, b""
    while True:
        chunk = response.read1(65536) if hasattr(response, "read1") else response.read(65536)
        if not chunk:
            break
        pending += chunk
        while b"\n\n" in pending:
            event, pending = pending.split(b"\n\n", 1)
            payload = event[6:].decode()
            if payload == "[DONE]":
                done = True
                continue
            data = json.loads(payload)
            if "error" in data:
                error = data["error"].get("message", "error")
                continue
            for choice in data.get("choices", []):
                ids += choice.get("token_ids", [])
                text += choice.get("text", "")
    conn.close()
    if not done and error is None:
        error = "the stream ended without [DONE]"
    return ids, text, error


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default="build/splitflow")
    parser.add_argument("--model", required=True)
    parser.add_argument("--injections", type=int, default=100)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--stop-seconds", type=float, default=1.5)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    common = ["--model", args.model, "--num-blocks", "256", "--max-batch-tokens", "64", "--max-seqs", "8",
              "--no-warmup", "--io-threads", "1", "--http-threads", "2", "--kv-transfer-timeout", "1"]
    pools = {"prompt": [], "token": []}
    instances = []
    try:
        for role in ["prompt", "prompt", "token", "token"]:
            port, kv_port = free_port(), free_port()
            inst = Instance(args.binary, ["serve", "--role", role, "--port", str(port), "--kv-port", str(kv_port)] + common,
                            f"{role}{len(pools[role])}")
            inst.port, inst.role = port, role
            pools[role].append(inst)
            instances.append(inst)
        mixed_port = free_port()
        mixed = Instance(args.binary, ["serve", "--role", "mixed", "--port", str(mixed_port)] + common, "mixed")
        router_port = free_port()
        route_args = ["route", "--port", str(router_port), "--health-interval", "0.3", "--upstream-timeout", "30",
                      "--max-attempts", "8"]
        for inst in instances:
            route_args += [f"--{inst.role}", f"http://127.0.0.1:{inst.port}"]
        router = Instance(args.binary, route_args, "router")

        references = {}
        for p, prompt in enumerate(PROMPTS):
            for length in LENGTHS:
                ids, text, error = stream(mixed_port, {"prompt": prompt, "max_tokens": length, "temperature": 0, "ignore_eos": True})
                assert error is None, error
                references[(p, length)] = (ids, text)

        counts = {"sent": 0, "equal": 0, "different": 0, "failed": 0}
        failures = []
        lock = threading.Lock()
        stop = threading.Event()

        def client(index):
            local = random.Random(args.seed * 1000 + index)
            while not stop.is_set():
                key = (local.randrange(len(PROMPTS)), local.choice(LENGTHS))
                with lock:
                    counts["sent"] += 1
                ids, text, error = stream(router_port, {"prompt": PROMPTS[key[0]], "max_tokens": key[1], "temperature": 0,
                                                        "ignore_eos": True})
                with lock:
                    if error is not None:
                        counts["failed"] += 1
                        failures.append(error)
                    elif (ids, text) == references[key]:
                        counts["equal"] += 1
                    else:
                        counts["different"] += 1
                        failures.append(f"different output for {key}")

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for thread in threads:
            thread.start()
        injected = {"kill -9 prompt": 0, "kill -9 token": 0, "SIGSTOP prompt": 0, "SIGSTOP token": 0}
        for n in range(args.injections):
            time.sleep(args.interval)
            role = rng.choice(["prompt", "token"])
            victim = rng.choice(pools[role])
            if rng.random() < 0.7:
                victim.kill()
                injected[f"kill -9 {role}"] += 1
                time.sleep(0.5)
                victim.start()
            else:
                victim.proc.send_signal(signal.SIGSTOP)
                injected[f"SIGSTOP {role}"] += 1
                time.sleep(args.stop_seconds)
                victim.proc.send_signal(signal.SIGCONT)
            print(f"injection {n + 1}/{args.injections}: {counts}", file=sys.stderr, flush=True)
        stop.set()
        for thread in threads:
            thread.join()
        with urllib.request.urlopen(f"http://127.0.0.1:{router_port}/router/instances") as response:
            router_counts = json.loads(response.read())["requests"]
        print(json.dumps({"injections": injected, "requests": counts, "router": router_counts}, indent=1))
        for failure in failures[:10]:
            print("failure:", failure)
    finally:
        for inst in instances + [locals().get("mixed"), locals().get("router")]:
            if inst is not None and inst.proc.poll() is None:
                inst.proc.send_signal(signal.SIGCONT)
                inst.kill()


if __name__ == "__main__":
    main()
