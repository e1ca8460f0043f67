#!/usr/bin/env python3
"""Soak test of `splitflow serve`: a crowd of clients over raw HTTP/1.1 sockets (issue 24, deliverable 6).

Python 3.11 standard library only (asyncio streams). The script starts `splitflow serve` itself
(stories260K-hf on the CPU backend, a free port, generous queue limits) or attaches to --url, then:

  soak (default)     N clients (default 1000) connect at once (a burst) and loop for --minutes (or
                     --rounds requests each): streaming and whole /v1/completions (and
                     /v1/chat/completions when the server has a chat template) with random max_tokens,
                     30 % of streams dropped mid-stream (RST or FIN), whole requests dropped before
                     their answer, slow readers (small receive buffers, pauses). A separate process
                     probes /health every 50-100 ms. After the clients stop and a settle, GET /metrics
                     must show every KV block free and nothing pending, waiting or running.
  stream-vs-whole    N streaming requests at once (fixed length, ignore_eos), time until all finish;
                     then the same N as whole (non-streaming) requests; the ratio whole/stream must be
                     <= --max-ratio (1.5).

Every client operation has a deadline (connect, headers, each body read), so a broken server
shows up as counted failures and hangs, never as a hung script. Prints a table, writes JSON under
bench/results/soak/ (or --out), exits 1 naming the failed checks, 2 when the server cannot start,
77 when the model is missing (skipped).

  bench/soak.py --splitflow build/splitflow                 # 1000 clients, 5 minutes
  bench/soak.py --short                                     # CI: 200 clients, <= 2 minutes
  bench/soak.py --mode stream-vs-whole --clients 1000
  bench/soak.py --url http://127.0.0.1:8000 --clients 300 --minutes 2   # an already running server
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import json
import math
import multiprocessing
import os
import random
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = (REPO / ".." / "shared" / "models" / "stories260K-hf").resolve()
RESULTS_DIR = REPO / "bench" / "results" / "soak"

# The gauges that must be idle after the load (src/server/metrics.cpp).
IDLE_GAUGES = ("splitflow_num_requests_pending", "splitflow_num_requests_running",
               "splitflow_num_sequences_waiting", "splitflow_num_sequences_running",
               "splitflow_num_sequences_swapped")
BLOCKS_TOTAL = "splitflow_kv_cache_blocks_total"
BLOCKS_FREE = "splitflow_kv_cache_blocks_free"


# ---------------------------------------------------------------------------------------------
# Shared helpers (bench/attacks.py imports them)
# ---------------------------------------------------------------------------------------------

def raise_nofile_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit (inherited by a server this script starts)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def git_commit() -> str:
    if os.environ.get("SPLITFLOW_COMMIT"):
        return os.environ["SPLITFLOW_COMMIT"]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return commit + ("+dirty" if dirty and commit else "") if commit else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def binary_info(path) -> dict:
    """The binary measured: its path and modification time (the commit is the tree's, which may be newer)."""
    try:
        stat = os.stat(path)
        mtime = datetime.datetime.fromtimestamp(stat.st_mtime, datetime.timezone.utc).isoformat()
        return {"path": str(Path(path).resolve()), "mtime": mtime, "bytes": stat.st_size}
    except OSError:
        return {"path": str(path)}


def now_stamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H-%M-%SZ")


def percentile(values, p):
    """Nearest-rank percentile (p in [0, 100]) of a list; None for an empty one."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def serve_help_flags(binary: str) -> set[str]:
    """The long flags `splitflow serve --help` lists (to pass only flags the build has)."""
    try:
        text = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", text))


def listen_counters():
    """TcpExt ListenOverflows / ListenDrops of this network namespace (/proc/net/netstat), or None."""
    try:
        with open("/proc/net/netstat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for names, values in zip(lines, lines[1:]):
        if names.startswith("TcpExt:") and values.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], (int(v) for v in values.split()[1:])))
            return {k: table.get(k, 0) for k in ("ListenOverflows", "ListenDrops")}
    return None


def proc_status_kb(pid: int, key: str):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class ServerProcess:
    """`splitflow serve ... --port 0`; the port comes from the startup line on stderr."""

    def __init__(self, binary: str, args: list[str], startup_timeout: float = 180.0):
        self.command = [binary, "serve", *args]
        self.log = collections.deque(maxlen=400)
        self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, errors="replace")
        self.pid = self.proc.pid
        self.host = self.port = None
        lines: "queue" = __import__("queue").Queue()

        def pump():
            for line in self.proc.stderr:
                self.log.append(line.rstrip("\n"))
                lines.put(line)
            lines.put(None)

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        deadline = time.monotonic() + startup_timeout
        while self.port is None:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:
                line = ""
            if line is None:
                raise RuntimeError("splitflow serve exited (status %s) before listening:\n%s"
                                   % (self.proc.wait(), "\n".join(self.log)))
            match = re.search(r"http://(\[[^\]]+\]|[^\s:/]+):(\d+)", line or "")
            if match:
                self.host, self.port = match.group(1).strip("[]"), int(match.group(2))
            elif time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("splitflow serve did not print its address within %.0f s:\n%s"
                                   % (startup_timeout, "\n".join(self.log)))
        if self.host in ("0.0.0.0", "::"):
            self.host = "127.0.0.1"
        self.url = f"http://{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_mb(self):
        kb = proc_status_kb(self.pid, "VmRSS")
        return None if kb is None else kb / 1024.0

    def hwm_mb(self):
        kb = proc_status_kb(self.pid, "VmHWM")
        return None if kb is None else kb / 1024.0

    def reset_hwm(self) -> bool:
        """Resets VmHWM to the current RSS (writing 5 to clear_refs, Linux >= 4.0)."""
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def stop(self, timeout: float = 60.0):
        """SIGTERM (drain), then SIGKILL after timeout. Returns (exit status, seconds, killed)."""
        if self.proc.poll() is not None:
            return self.proc.returncode, 0.0, False
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            status = self.proc.wait(timeout=timeout)
            return status, time.monotonic() - start, False
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode, time.monotonic() - start, True

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass


class RssSampler(threading.Thread):
    """Samples a process's VmRSS every `interval` seconds; keeps the peak and a coarse series."""

    def __init__(self, pid: int, interval: float = 0.2):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak_mb = 0.0
        self.last_mb = None
        self.series = []  # (seconds since start, MB) every ~2 s
        self.gone_at = None  # seconds since start when VmRSS vanished (the process exited)
        self._stop_event = threading.Event()
        self._t0 = time.monotonic()

    def run(self):
        last_series = -1e9
        while not self._stop_event.is_set():
            kb = proc_status_kb(self.pid, "VmRSS")
            if kb is None and self.gone_at is None:
                self.gone_at = round(time.monotonic() - self._t0, 1)
            if kb is not None:
                mb = kb / 1024.0
                self.last_mb = mb
                self.peak_mb = max(self.peak_mb, mb)
                t = time.monotonic() - self._t0
                if t - last_series >= 2.0:
                    self.series.append((round(t, 1), round(mb, 1)))
                    last_series = t
            self._stop_event.wait(self.interval)

    def stop(self):
        self._stop_event.set()
        self.join(timeout=5)


def parse_url(url: str):
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http":
        raise SystemExit(f"only http:// URLs are supported, not {url}")
    return parts.hostname, parts.port or 80


def resolve(host: str, port: int):
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    return family, address


async def open_conn(target, timeout: float, rcvbuf: int | None = None, limit: int = 1 << 16):
    """A TCP connection to target = (family, address) within timeout; (reader, writer)."""
    family, address = target
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            await loop.sock_connect(sock, address)
        return await asyncio.open_connection(sock=sock, limit=limit)
    except BaseException:
        sock.close()
        raise


def abort_writer(writer, rst: bool = True):
    """Closes a connection at once: RST (SO_LINGER 0) or a FIN without waiting."""
    try:
        if rst:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        else:
            writer.close()
    except OSError:
        pass


def build_request(method: str, path: str, host_header: str, body: bytes | None = None, headers=(),
                  keepalive: bool = True) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host_header}", "User-Agent: splitflow-soak",
             "Accept: */*", "Connection: " + ("keep-alive" if keepalive else "close")]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    lines += list(headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def parse_head(raw: bytes):
    """(status, {lower-case name: [values]}) of a response head ending in CRLFCRLF."""
    text = raw.decode("latin-1")
    lines = text.split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise ValueError(f"bad status line {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return int(parts[1]), headers


async def read_head(reader):
    raw = await reader.readuntil(b"\r\n\r\n")
    return parse_head(raw)


async def read_body(reader, headers, timeout: float, max_bytes: int = 64 << 20) -> bytes:
    """The whole body (Content-Length, chunked, or until EOF), each read within timeout."""
    if "chunked" in ",".join(headers.get("transfer-encoding", [])).lower():
        out = bytearray()
        async for piece in iter_chunks(reader, timeout):
            out += piece
            if len(out) > max_bytes:
                raise ValueError("body too large")
        return bytes(out)
    if "content-length" in headers:
        n = int(headers["content-length"][-1])
        async with asyncio.timeout(timeout):
            return await reader.readexactly(n)
    out = bytearray()
    while True:
        async with asyncio.timeout(timeout):
            piece = await reader.read(1 << 16)
        if not piece:
            return bytes(out)
        out += piece
        if len(out) > max_bytes:
            raise ValueError("body too large")


async def iter_chunks(reader, timeout: float):
    """De-chunked pieces of a chunked body; each chunk read within timeout."""
    while True:
        async with asyncio.timeout(timeout):
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";", 1)[0].strip() or b"x", 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                    pass
                return
            data = await reader.readexactly(size + 2)
        yield data[:-2]


async def http_get(target, host_header: str, path: str, timeout: float = 10.0):
    """One GET on a fresh connection: (status, headers, body)."""
    reader, writer = await open_conn(target, timeout)
    try:
        writer.write(build_request("GET", path, host_header, keepalive=False))
        async with asyncio.timeout(timeout):
            status, headers = await read_head(reader)
        body = await read_body(reader, headers, timeout)
        return status, headers, body
    finally:
        abort_writer(writer, rst=False)


async def http_post_json(target, host_header: str, path: str, payload, timeout: float = 30.0):
    reader, writer = await open_conn(target, timeout)
    try:
        writer.write(build_request("POST", path, host_header, json.dumps(payload).encode(), keepalive=False))
        async with asyncio.timeout(timeout):
            status, headers = await read_head(reader)
        body = await read_body(reader, headers, timeout)
        return status, headers, body
    finally:
        abort_writer(writer, rst=False)


def parse_metrics(text: str) -> dict:
    values = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            values[name.strip()] = float(value)
        except ValueError:
            pass
    return values


async def fetch_metrics(target, host_header: str, timeout: float = 10.0):
    status, _, body = await http_get(target, host_header, "/metrics", timeout)
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    return parse_metrics(body.decode("utf-8", "replace"))


def metrics_idle(metrics: dict):
    """(idle?, what is not) from the gauges: every block free, nothing pending/waiting/running."""
    problems = []
    for name in IDLE_GAUGES:
        if metrics.get(name, 0.0) != 0.0:
            problems.append(f"{name}={metrics[name]:g}")
    total, free = metrics.get(BLOCKS_TOTAL), metrics.get(BLOCKS_FREE)
    if total is None or free is None:
        problems.append("KV block gauges missing")
    elif free != total:
        problems.append(f"{BLOCKS_FREE}={free:g} of {total:g}")
    return not problems, problems


def counter_delta(before: dict, after: dict, prefix: str) -> dict:
    out = {}
    for name, value in after.items():
        if name.startswith(prefix):
            out[name[len(prefix):] or name] = value - before.get(name, 0.0)
    return out


async def wait_idle(target, host_header: str, settle_s: float):
    """Polls /metrics until idle or settle_s; (idle, seconds waited, last metrics, problems)."""
    start = time.monotonic()
    metrics, problems = {}, ["no /metrics answer"]
    while True:
        try:
            metrics = await fetch_metrics(target, host_header)
            idle, problems = metrics_idle(metrics)
            if idle:
                return True, time.monotonic() - start, metrics, []
        except (OSError, asyncio.TimeoutError, RuntimeError, ValueError, asyncio.IncompleteReadError) as error:
            problems = [f"/metrics: {type(error).__name__} {error}"]
        if time.monotonic() - start > settle_s:
            return False, time.monotonic() - start, metrics, problems
        await asyncio.sleep(0.5)


# --- /health probe, in its own process so the clients' event loop does not delay it ------------

def _probe_process(host, port, lo, hi, timeout, stop_event, out_queue):
    try:
        results = asyncio.run(_probe_loop(host, port, lo, hi, timeout, stop_event))
    except BaseException as error:  # report, never hang the parent
        results = {"error": repr(error), "samples": []}
    out_queue.put(results)


async def _probe_loop(host, port, lo, hi, timeout, stop_event):
    target = resolve(host, port)
    host_header = f"{host}:{port}"
    samples = []  # (t since start, ms, outcome)
    t0 = time.monotonic()
    pending = set()

    async def one():
        start = time.monotonic()
        outcome = "ok"
        try:
            async with asyncio.timeout(timeout):
                status, _, _ = await http_get(target, host_header, "/health", timeout)
            if status != 200:
                outcome = f"status_{status}"
        except asyncio.TimeoutError:
            outcome = "timeout"
        except asyncio.IncompleteReadError:
            outcome = "eof"
        except ConnectionRefusedError:
            outcome = "refused"
        except ConnectionResetError:
            outcome = "reset"
        except (OSError, ValueError) as error:
            outcome = type(error).__name__
        samples.append((round(start - t0, 3), (time.monotonic() - start) * 1000.0, outcome))

    while not stop_event.is_set():
        task = asyncio.ensure_future(one())
        pending.add(task)
        task.add_done_callback(pending.discard)
        await asyncio.sleep(random.uniform(lo, hi))
    if pending:
        await asyncio.wait(list(pending), timeout=timeout + 5)
    return {"samples": samples}


class HealthProbe:
    """GET /health on a fresh connection every lo..hi seconds (a new probe does not wait for a slow one)."""

    def __init__(self, host: str, port: int, lo: float = 0.05, hi: float = 0.10, timeout: float = 30.0):
        ctx = multiprocessing.get_context("spawn")
        self._stop = ctx.Event()
        self._queue = ctx.Queue()
        self.timeout = timeout
        self._proc = ctx.Process(target=_probe_process, args=(host, port, lo, hi, timeout, self._stop, self._queue),
                                 daemon=True)

    def start(self):
        self._proc.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        try:
            result = self._queue.get(timeout=self.timeout + 30)
        except Exception:
            result = {"error": "probe process gave no result", "samples": []}
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
        return summarize_probe(result)


def summarize_probe(result: dict) -> dict:
    samples = result.get("samples", [])
    all_ms = [ms for _, ms, _ in samples]
    failures = collections.Counter(outcome for _, _, outcome in samples if outcome != "ok")
    slow = sorted(samples, key=lambda s: -s[1])[:10]
    out = {
        "probes": len(samples),
        "ok": len(samples) - sum(failures.values()),
        "failures": dict(failures),
        "p50_ms": _r(percentile(all_ms, 50)),
        "p99_ms": _r(percentile(all_ms, 99)),
        "max_ms": _r(max(all_ms) if all_ms else None),
        "over_100ms": sum(1 for ms in all_ms if ms > 100.0),
        "slowest": [{"t_s": t, "ms": _r(ms), "outcome": o} for t, ms, o in slow],
        "first_failure_s": next((t for t, _, o in samples if o != "ok"), None),
    }
    if "error" in result:
        out["error"] = result["error"]
    return out


def _r(value, digits=1):
    return None if value is None else round(value, digits)


def print_table(title: str, rows, out=sys.stdout):
    """rows: (name, value) pairs; a None name prints a separator."""
    width = max((len(str(name)) for name, _ in rows if name is not None), default=10)
    print(f"\n{title}", file=out)
    print("-" * (width + 40), file=out)
    for name, value in rows:
        if name is None:
            print("-" * (width + 40), file=out)
        else:
            print(f"{str(name):<{width}}  {value}", file=out)
    print("-" * (width + 40), file=out)


def record_load(values):
    return " ".join(f"{v:.1f}" for v in values)


def print_checks(checks, out=sys.stdout):
    for check in checks:
        mark = "PASS" if check["passed"] else "FAIL"
        print(f"  [{mark}] {check['name']}: {check['detail']}", file=out)
    failed = [c["name"] for c in checks if not c["passed"]]
    print(("FAILED checks: " + ", ".join(failed)) if failed else "all checks passed", file=out)


def portable(value):
    """`value` with absolute paths of this checkout written relative to it (and ../shared for the
    shared models beside it), so a committed result names no machine's directories."""
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v) for v in value]
    if isinstance(value, str):
        return value.replace(str(REPO.parent / "shared") + "/", "../shared/").replace(str(REPO) + "/", "")
    return value


def write_json(directory: Path, stem: str, record: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stem}-{now_stamp()}.json"
    with open(path, "w") as f:
        json.dump(portable(record), f, indent=2, sort_keys=False)
        f.write("\n")
    return path


# ---------------------------------------------------------------------------------------------
# Soak clients
# ---------------------------------------------------------------------------------------------

SENTENCES = [
    "Once upon a time, there was a little girl named Lily.",
    "She loved to play outside in the park with her dog.",
    "One day, a big red ball rolled down the hill.",
    "Tom and his mom went to the store to buy some milk.",
    "The sun was shining and the birds were singing.",
    "He saw a small cat sitting under a tree.",
    "They were very happy and played all day long.",
    "The little boy wanted to fly like a bird.",
    "Mom said, \"Be careful, the floor is wet!\"",
    "Ben found a shiny rock near the river.",
]


def random_prompt(rng: random.Random, max_chars: int) -> str:
    if rng.random() < 0.5:
        return rng.choice(SENTENCES).split(",")[0]
    text = []
    while sum(len(s) + 1 for s in text) < rng.randint(20, max_chars):
        text.append(rng.choice(SENTENCES))
    return " ".join(text)[:max_chars]


class Stats:
    def __init__(self):
        self.c = collections.Counter()      # counts
        self.failed_reasons = collections.Counter()
        self.hang_phases = collections.Counter()
        self.connect_errors = collections.Counter()
        self.statuses = collections.Counter()
        self.cancel_points = collections.Counter()
        self.lost = collections.Counter()   # accepted (2xx) but neither finished nor cancelled
        self.first_connect_ms = []
        self.ttfb_ms = []                   # request written -> response head
        self.total_ms = collections.defaultdict(list)
        self.examples = collections.defaultdict(list)  # reason -> a few details

    def example(self, reason: str, detail: str):
        if len(self.examples[reason]) < 3:
            self.examples[reason].append(detail[:300])


class Outcome(Exception):
    """Ends one request: kind in finished/cancelled/failed/hang/rejected_429."""

    def __init__(self, kind: str, reason: str = "", detail: str = ""):
        super().__init__(kind)
        self.kind, self.reason, self.detail = kind, reason, detail


class StaleConnection(Exception):
    pass


class SoakClient:
    def __init__(self, index: int, cfg, shared, stats: Stats, rng: random.Random, slow: bool):
        self.index, self.cfg, self.shared, self.stats, self.rng, self.slow = index, cfg, shared, stats, rng, slow
        self.conn = None  # (reader, writer, requests served)
        self.accepted = False

    # --- connection ---

    async def connect(self, first: bool):
        cfg = self.cfg
        start = time.monotonic()
        try:
            if self.slow:
                reader, writer = await open_conn(self.shared.target, cfg.connect_timeout, rcvbuf=4096, limit=4096)
            else:
                reader, writer = await open_conn(self.shared.target, cfg.connect_timeout)
        except asyncio.TimeoutError:
            self._connect_failed("timeout")
            return False
        except OSError as error:
            self._connect_failed(type(error).__name__)
            return False
        if first:
            self.stats.first_connect_ms.append((time.monotonic() - start) * 1000.0)
        self.stats.c["connections"] += 1
        self.conn = [reader, writer, 0]
        return True

    def _connect_failed(self, reason: str):
        self.stats.c["connection_failures"] += 1
        self.stats.connect_errors[reason] += 1

    def drop(self, rst: bool = False):
        if self.conn is not None:
            abort_writer(self.conn[1], rst=rst)
            self.conn = None

    # --- one request ---

    def make_request(self):
        cfg, rng = self.cfg, self.rng
        chat = self.shared.chat and rng.random() < cfg.chat_fraction
        stream = rng.random() < cfg.stream_fraction
        max_tokens = rng.randint(1, cfg.max_tokens)
        payload = {"model": self.shared.model_name, "max_tokens": max_tokens,
                   "temperature": rng.choice([0.0, 0.7, 1.0]), "seed": rng.randint(0, 1 << 30), "stream": stream}
        prompt = random_prompt(rng, cfg.prompt_chars)
        if chat:
            payload["messages"] = [{"role": "user", "content": prompt}]
            path = "/v1/chat/completions"
        else:
            payload["prompt"] = prompt
            path = "/v1/completions"
        if stream and rng.random() < 0.5:
            payload["stream_options"] = {"include_usage": True}
        plan = None
        if stream and rng.random() < cfg.disconnect_fraction:
            if rng.random() < 0.1:
                plan = ("before_head", rng.uniform(0.0, 0.2))
            else:
                plan = ("mid_stream", rng.randint(1, max(1, max_tokens // 2)))
        elif not stream and rng.random() < cfg.whole_disconnect_fraction:
            plan = ("before_answer", rng.uniform(0.0, 1.0))
        kind = ("chat_" if chat else "") + ("stream" if stream else "whole")
        return path, json.dumps(payload).encode(), stream, kind, plan

    async def run_one(self):
        path, body, stream, kind, plan = self.make_request()
        stats = self.stats
        request = build_request("POST", path, self.shared.host_header, body, keepalive=True)
        start = time.monotonic()
        for attempt in (0, 1):
            if self.conn is None and not await self.connect(first=False):
                await asyncio.sleep(self.rng.uniform(0.1, 0.5))
                return
            reused = self.conn[2] > 0
            self.accepted = False
            try:
                async with asyncio.timeout(self.cfg.request_timeout):
                    outcome = await self._exchange(request, stream, plan, reused)
                break
            except asyncio.TimeoutError:
                self.drop(rst=True)
                outcome = Outcome("hang", "request_total", f"not done within {self.cfg.request_timeout:g} s")
                outcome.accepted = self.accepted
                break
            except StaleConnection:
                stats.c["stale_keepalive_retries"] += 1
                self.drop()
                if attempt == 1:
                    outcome = Outcome("failed", "eof_before_status")
        stats.c["sent"] += 1
        stats.c[f"sent_{kind}"] += 1
        stats.c[outcome.kind] += 1
        stats.c[f"{outcome.kind}_{kind}"] += 1
        if outcome.kind == "failed":
            stats.failed_reasons[outcome.reason] += 1
            stats.example(outcome.reason, outcome.detail)
        elif outcome.kind == "hang":
            stats.hang_phases[outcome.reason] += 1
            stats.example("hang_" + outcome.reason, outcome.detail)
        elif outcome.kind == "cancelled":
            stats.cancel_points[outcome.reason] += 1
        if outcome.kind in ("failed", "hang") and getattr(outcome, "accepted", False):
            stats.lost[outcome.kind + ":" + outcome.reason] += 1
        if outcome.kind == "finished":
            stats.total_ms[kind].append((time.monotonic() - start) * 1000.0)

    async def _exchange(self, request: bytes, stream: bool, plan, reused: bool) -> Outcome:
        cfg, stats = self.cfg, self.stats
        reader, writer = self.conn[0], self.conn[1]
        try:
            writer.write(request)
            async with asyncio.timeout(cfg.hang_s):
                await writer.drain()
        except asyncio.TimeoutError:
            self.drop(rst=True)
            return Outcome("hang", "write", "request not written")
        except OSError as error:
            self.drop()
            if reused:
                raise StaleConnection()
            return Outcome("failed", "write_" + type(error).__name__, str(error))
        sent_at = time.monotonic()
        self.conn[2] += 1

        # --- the response head ---
        head_timeout = cfg.hang_s
        if plan and plan[0] in ("before_head", "before_answer"):
            head_timeout = plan[1]
        try:
            async with asyncio.timeout(head_timeout):
                status, headers = await read_head(reader)
        except asyncio.TimeoutError:
            if plan and plan[0] in ("before_head", "before_answer"):
                self.drop(rst=self.rng.random() < 0.5)
                return Outcome("cancelled", plan[0])
            self.drop(rst=True)
            return Outcome("hang", "head", f"no response head within {cfg.hang_s} s")
        except asyncio.IncompleteReadError as error:
            self.drop()
            if reused and not error.partial:
                raise StaleConnection()
            return Outcome("failed", "eof_before_status", repr(error.partial[:100]))
        except asyncio.LimitOverrunError:
            self.drop()
            return Outcome("failed", "head_too_large")
        except ValueError as error:
            self.drop()
            return Outcome("failed", "bad_status_line", str(error))
        except ConnectionResetError as error:
            self.drop()
            if reused:
                raise StaleConnection()
            return Outcome("failed", "reset_before_status", str(error))
        except OSError as error:
            self.drop()
            return Outcome("failed", "head_" + type(error).__name__, str(error))
        stats.ttfb_ms.append((time.monotonic() - sent_at) * 1000.0)
        stats.statuses[status] += 1
        keepalive = "close" not in ",".join(headers.get("connection", [])).lower()

        if not 200 <= status < 300:
            try:
                body = await read_body(reader, headers, cfg.hang_s)
            except (asyncio.TimeoutError, OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                body, keepalive = b"", False
            if not keepalive:
                self.drop()
            if status == 429:
                return Outcome("rejected_429", "429")
            reason = f"http_{status}"
            return Outcome("failed", reason, body[:300].decode("utf-8", "replace"))

        stats.c["accepted"] += 1
        self.accepted = True
        outcome = await (self._read_stream(reader, headers, plan) if stream else self._read_whole(reader, headers))
        outcome.accepted = True
        if outcome.kind != "finished" or not keepalive:
            if self.conn is not None:
                self.drop(rst=outcome.kind == "cancelled" and self.rng.random() < 0.5)
        return outcome

    async def _read_whole(self, reader, headers) -> Outcome:
        try:
            body = await read_body(reader, headers, self.cfg.hang_s)
        except asyncio.TimeoutError:
            return Outcome("hang", "body", "no body progress")
        except asyncio.IncompleteReadError as error:
            return Outcome("failed", "truncated_body", f"{len(error.partial)} bytes then EOF")
        except (OSError, ValueError, asyncio.LimitOverrunError) as error:
            return Outcome("failed", "body_" + type(error).__name__, str(error))
        try:
            value = json.loads(body)
            reasons = [c.get("finish_reason") for c in value["choices"]]
        except (ValueError, KeyError, TypeError, AttributeError):
            return Outcome("failed", "bad_json", body[:300].decode("utf-8", "replace"))
        if any(r not in ("stop", "length") for r in reasons):
            return Outcome("failed", "finish_" + str(next(r for r in reasons if r not in ("stop", "length"))))
        return Outcome("finished")

    async def _read_stream(self, reader, headers, plan) -> Outcome:
        cfg, rng = self.cfg, self.rng
        if "chunked" not in ",".join(headers.get("transfer-encoding", [])).lower():
            # SSE until EOF (a server may stream without chunking): read raw.
            pieces = self._raw_pieces(reader)
        else:
            pieces = iter_chunks(reader, cfg.hang_s)
        buffer = bytearray()
        events = 0
        drop_after = plan[1] if plan and plan[0] == "mid_stream" else None
        long_pause_at = rng.randint(1, 8) if self.slow else None
        try:
            async for piece in pieces:
                buffer += piece
                while True:
                    end = buffer.find(b"\n\n")
                    if end < 0:
                        break
                    event = bytes(buffer[:end])
                    del buffer[:end + 2]
                    events += 1
                    if event.startswith(b"data: [DONE]"):
                        # The rest of the body (the last chunk) must go before the connection is reused.
                        async for rest in pieces:
                            if rest.strip():
                                return Outcome("failed", "data_after_done", rest[:200].decode("utf-8", "replace"))
                        return Outcome("finished")
                    if event.startswith(b'data: {"error"'):
                        return Outcome("failed", "stream_error_event", event[:300].decode("utf-8", "replace"))
                    if b'"finish_reason":"abort"' in event:
                        return Outcome("failed", "finish_abort", event[:300].decode("utf-8", "replace"))
                    if drop_after is not None and events >= drop_after:
                        return Outcome("cancelled", "mid_stream")
                if self.slow:
                    if long_pause_at is not None and events >= long_pause_at:
                        long_pause_at = None
                        await asyncio.sleep(rng.uniform(1.0, 3.0))
                    elif rng.random() < 0.5:
                        await asyncio.sleep(rng.uniform(0.02, 0.2))
        except asyncio.TimeoutError:
            return Outcome("hang", "stream", f"no stream progress for {cfg.hang_s} s after {events} events")
        except asyncio.IncompleteReadError:
            return Outcome("failed", "stream_truncated", f"EOF after {events} events")
        except ConnectionResetError:
            return Outcome("failed", "stream_reset", f"reset after {events} events")
        except (OSError, ValueError, asyncio.LimitOverrunError) as error:
            return Outcome("failed", "stream_" + type(error).__name__, str(error))
        return Outcome("failed", "stream_without_done", f"{events} events, no [DONE]")

    async def _raw_pieces(self, reader):
        while True:
            async with asyncio.timeout(self.cfg.hang_s):
                piece = await reader.read(4096 if self.slow else 1 << 16)
            if not piece:
                return
            yield piece


class Shared:
    def __init__(self, target, host_header, model_name, chat):
        self.target, self.host_header, self.model_name, self.chat = target, host_header, model_name, chat
        self.stop_at = None
        self.go = asyncio.Event()


async def run_clients(cfg, shared: Shared, n_clients: int, seconds: float | None, rounds: int | None,
                      stats: Stats, seed: int, disconnects: bool = True, progress: bool = True):
    """n_clients loop until `seconds` pass (or `rounds` requests each); all connect at once."""
    rng0 = random.Random(seed)
    n_slow = int(round(n_clients * cfg.slow_fraction))
    slow_set = set(rng0.sample(range(n_clients), n_slow))

    local_cfg = cfg
    if not disconnects:
        local_cfg = argparse.Namespace(**vars(cfg))
        local_cfg.disconnect_fraction = 0.0
        local_cfg.whole_disconnect_fraction = 0.0

    async def client(i):
        c = SoakClient(i, local_cfg, shared, stats, random.Random(seed * 100003 + i), i in slow_set)
        await shared.go.wait()
        await c.connect(first=True)
        done = 0
        while True:
            if rounds is not None and done >= rounds:
                break
            if rounds is None and time.monotonic() >= shared.stop_at:
                break
            await c.run_one()
            done += 1
        c.drop()

    tasks = [asyncio.ensure_future(client(i)) for i in range(n_clients)]
    await asyncio.sleep(0.2)  # every task waits on `go`
    start = time.monotonic()
    shared.stop_at = start + (seconds if seconds is not None else 1e12)
    shared.go.set()
    # Every request ends within its own deadlines; the watchdog only guards against a script bug.
    watchdog = (seconds or 0) + cfg.request_timeout + cfg.connect_timeout + 120 + (rounds or 0) * cfg.request_timeout

    async def reporter():
        while True:
            await asyncio.sleep(10)
            c = stats.c
            print(f"  t={time.monotonic() - start:6.0f}s sent {c['sent']} accepted {c['accepted']} finished "
                  f"{c['finished']} cancelled {c['cancelled']} failed {c['failed']} hang {c['hang']} "
                  f"429 {c['rejected_429']} connfail {c['connection_failures']}", flush=True)

    rep = asyncio.ensure_future(reporter()) if progress else None
    done, pending = await asyncio.wait(tasks, timeout=watchdog)
    if rep:
        rep.cancel()
    for task in pending:
        task.cancel()
    if pending:
        stats.c["watchdog_cancelled_clients"] += len(pending)
        await asyncio.wait(pending, timeout=10)
    for task in done:
        if task.exception() is not None:
            stats.c["client_crashes"] += 1
            stats.example("client_crash", repr(task.exception()))
    return time.monotonic() - start


# ---------------------------------------------------------------------------------------------
# Modes
# ---------------------------------------------------------------------------------------------

async def discover(target, host_header, cfg):
    """(model name, chat available) from /v1/models and one chat request."""
    model_name = None
    try:
        status, _, body = await http_get(target, host_header, "/v1/models", 30)
        if status == 200:
            model_name = json.loads(body)["data"][0]["id"]
    except (OSError, asyncio.TimeoutError, ValueError, KeyError, IndexError, asyncio.IncompleteReadError):
        pass
    chat = False
    if cfg.chat_fraction > 0:
        try:
            status, _, _ = await http_post_json(target, host_header, "/v1/chat/completions",
                                                {"model": model_name, "max_tokens": 1,
                                                 "messages": [{"role": "user", "content": "Hi"}]}, 60)
            chat = status == 200
        except (OSError, asyncio.TimeoutError, ValueError, asyncio.IncompleteReadError):
            chat = False
    return model_name, chat


async def wait_healthy(target, host_header, timeout=120.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            status, _, _ = await http_get(target, host_header, "/health", 5)
            if status == 200:
                return
            last = f"status {status}"
        except (OSError, asyncio.TimeoutError, ValueError, asyncio.IncompleteReadError) as error:
            last = repr(error)
        await asyncio.sleep(0.2)
    raise RuntimeError(f"/health not 200 within {timeout} s ({last})")


def stats_summary(stats: Stats, wall_s: float):
    c = stats.c
    accepted = c["accepted"]
    summary = {
        "wall_s": round(wall_s, 1),
        "connections": c["connections"],
        "connection_failures": c["connection_failures"],
        "connection_failure_reasons": dict(stats.connect_errors),
        "burst_connect_ms": {"n": len(stats.first_connect_ms), "p50": _r(percentile(stats.first_connect_ms, 50)),
                             "p99": _r(percentile(stats.first_connect_ms, 99)),
                             "max": _r(max(stats.first_connect_ms) if stats.first_connect_ms else None)},
        "sent": c["sent"],
        "accepted_2xx": accepted,
        "finished": c["finished"],
        "cancelled": c["cancelled"],
        "cancelled_by_point": dict(stats.cancel_points),
        "failed": c["failed"],
        "failed_reasons": dict(stats.failed_reasons),
        "rejected_429": c["rejected_429"],
        "hangs": c["hang"],
        "hang_phases": dict(stats.hang_phases),
        "accepted_not_finished_or_cancelled": sum(stats.lost.values()),
        "lost_by_reason": dict(stats.lost),
        "stale_keepalive_retries": c["stale_keepalive_retries"],
        "statuses": {str(k): v for k, v in sorted(stats.statuses.items())},
        "by_kind": {k: v for k, v in sorted(c.items()) if k.startswith(("sent_", "finished_", "cancelled_", "failed_",
                                                                       "hang_", "rejected_429_"))},
        "response_head_ms": {"p50": _r(percentile(stats.ttfb_ms, 50)), "p99": _r(percentile(stats.ttfb_ms, 99))},
        "finished_ms": {k: {"n": len(v), "p50": _r(percentile(v, 50)), "p99": _r(percentile(v, 99))}
                        for k, v in sorted(stats.total_ms.items())},
        "client_crashes": c["client_crashes"],
        "watchdog_cancelled_clients": c["watchdog_cancelled_clients"],
        "examples": {k: v for k, v in stats.examples.items()},
    }
    summary["requests_per_s"] = round(c["sent"] / wall_s, 1) if wall_s > 0 else None
    return summary


def server_args_for(cfg, flags: set[str], clients: int) -> list[str]:
    args = ["--model", str(cfg.model), "--port", "0", "--host", "127.0.0.1"]
    if "--backend" in flags:
        args += ["--backend", "cpu"]
    if "--max-queue" in flags:
        args += ["--max-queue", str(max(4096, 4 * clients))]
    if "--io-threads" not in flags and "--http-threads" in flags:
        # The thread-per-connection (cpp-httplib) server: a thread for each client and the probes.
        args += ["--http-threads", str(clients + 256)]
    if "--max-connections" in flags:  # the event-driven front: room for every client and the probes
        args += ["--max-connections", str(max(8192, clients + 1024))]
    for extra in cfg.server_arg:
        args += extra.split()
    return args


def start_server(cfg, clients: int):
    binary = str(cfg.splitflow)
    if not os.access(binary, os.X_OK):
        print(f"soak: no splitflow binary at {binary}", file=sys.stderr)
        sys.exit(2)
    flags = serve_help_flags(binary)
    args = server_args_for(cfg, flags, clients)
    if cfg.chat_template:
        args += ["--chat-template", str(cfg.chat_template)]
    print(f"soak: starting {binary} serve {' '.join(args)}", flush=True)
    try:
        return ServerProcess(binary, args)
    except RuntimeError as error:
        print(f"soak: {error}", file=sys.stderr)
        sys.exit(2)


async def soak_mode(cfg, server: ServerProcess | None, target, host_header) -> dict:
    results = {}
    model_name, chat = await discover(target, host_header, cfg)
    results["model_name"], results["chat"] = model_name, chat
    print(f"soak: model {model_name!r}, chat {'on' if chat else 'off (no chat template: completions only)'}",
          flush=True)
    rss_launch = server.rss_mb() if server else None

    if cfg.warmup_s > 0:
        print(f"soak: warm-up {cfg.warmup_s:.0f} s with {cfg.clients} clients", flush=True)
        warm = Stats()
        await run_clients(cfg, Shared(target, host_header, model_name, chat), cfg.clients, cfg.warmup_s, None,
                          warm, cfg.seed + 7, disconnects=True, progress=False)
        idle, waited, _, problems = await wait_idle(target, host_header, cfg.settle_s)
        results["warmup"] = {"sent": warm.c["sent"], "finished": warm.c["finished"], "failed": warm.c["failed"],
                             "hangs": warm.c["hang"], "idle_after_s": round(waited, 1), "idle": idle}
        await asyncio.sleep(1.0)

    metrics_before = await fetch_metrics(target, host_header)
    rss_start = server.rss_mb() if server else None
    if server:
        server.reset_hwm()
    sampler = None
    if server:
        sampler = RssSampler(server.pid)
        sampler.start()
    probe = HealthProbe(*target_host_port(cfg, server), timeout=cfg.probe_timeout).start()
    await asyncio.sleep(0.5)

    stats = Stats()
    listen_before = listen_counters()
    seconds = None if cfg.rounds else cfg.minutes * 60.0
    print(f"soak: {cfg.clients} clients, {'%d rounds' % cfg.rounds if cfg.rounds else '%.1f min' % cfg.minutes}, "
          f"stream {cfg.stream_fraction:.0%}, stream disconnects {cfg.disconnect_fraction:.0%}, "
          f"whole disconnects {cfg.whole_disconnect_fraction:.0%}, slow readers {cfg.slow_fraction:.0%}, "
          f"max_tokens 1..{cfg.max_tokens}, hang after {cfg.hang_s:.0f} s", flush=True)
    wall = await run_clients(cfg, Shared(target, host_header, model_name, chat), cfg.clients, seconds, cfg.rounds,
                             stats, cfg.seed)
    health = probe.stop()
    listen_after = listen_counters()
    results["load"] = stats_summary(stats, wall)
    if listen_before and listen_after:  # the whole machine's counters: a local server's overflowed backlog
        results["load"]["listen_overflows"] = {k: listen_after[k] - listen_before[k] for k in listen_after}
    results["health"] = health

    print(f"soak: clients done in {wall:.1f} s; settling (at most {cfg.settle_s:.0f} s)", flush=True)
    alive_before_settle = server.alive() if server else True
    idle, waited, metrics_after, problems = await wait_idle(target, host_header, cfg.settle_s)
    results["settle"] = {"idle": idle, "waited_s": round(waited, 1), "problems": problems,
                         "gauges": {k: metrics_after.get(k) for k in (*IDLE_GAUGES, BLOCKS_TOTAL, BLOCKS_FREE)}}
    results["server_counters"] = {
        "finished_by_reason": counter_delta(metrics_before, metrics_after, "splitflow_request_finished_total"),
        "rejected_by_reason": counter_delta(metrics_before, metrics_after, "splitflow_requests_rejected_total"),
        "generation_tokens": metrics_after.get("splitflow_generation_tokens_total", 0)
        - metrics_before.get("splitflow_generation_tokens_total", 0),
        "preemptions": metrics_after.get("splitflow_preemptions_total", 0)
        - metrics_before.get("splitflow_preemptions_total", 0),
    }
    add_queue_estimate(cfg, results)
    if "splitflow_http_open_connections" in metrics_after:  # the event-driven front's own gauges
        results["server_counters"]["http"] = {
            "open_connections_after": metrics_after.get("splitflow_http_open_connections"),
            "open_requests_after": metrics_after.get("splitflow_http_open_requests"),
            "refused_connections": metrics_after.get("splitflow_http_refused_connections_total", 0)
            - metrics_before.get("splitflow_http_refused_connections_total", 0),
            "deadline_closes": metrics_after.get("splitflow_http_deadline_closes_total", 0)
            - metrics_before.get("splitflow_http_deadline_closes_total", 0),
        }
    await asyncio.sleep(cfg.rss_settle_s)
    if server:
        sampler.stop()
        results["rss_mb"] = {"launch": _r(rss_launch), "start": _r(rss_start), "peak": _r(max(sampler.peak_mb,
                             server.hwm_mb() or 0)), "end": _r(server.rss_mb()), "series": sampler.series}
    results["server_alive_after_load"] = alive_before_settle and (server.alive() if server else True)
    if server and not results["server_alive_after_load"]:
        results["server_exit"] = {"status": server.proc.poll(), "seconds_into_load": sampler.gone_at,
                                  "log_tail": list(server.log)[-20:]}
    return results


def soak_checks(cfg, results, stop_info) -> list[dict]:
    load, health = results["load"], results["health"]
    checks = []

    def check(name, passed, detail):
        checks.append({"name": name, "passed": bool(passed), "detail": detail})

    if not results["server_alive_after_load"]:
        exit_info = results.get("server_exit", {})
        check("no_crash", False, f"the server exited by itself during the load (status {exit_info.get('status')}, "
                                 f"~{exit_info.get('seconds_into_load')} s in); its log ends: "
                                 + " | ".join(exit_info.get("log_tail", [])[-3:]))
    else:
        check("no_crash", stop_info is None or stop_info["exit_status"] == 0,
              "server alive after the load" + ("" if stop_info is None else
                                               f"; exit status {stop_info['exit_status']} after SIGTERM"
                                               f"{' (killed)' if stop_info['killed'] else ''}"))
    check("no_connection_failures", load["connection_failures"] == 0,
          f"{load['connection_failures']} {load['connection_failure_reasons'] or ''}".strip())
    overflows = load.get("listen_overflows")
    if overflows is not None and not cfg.url:
        burst = load["burst_connect_ms"]
        check("no_listen_overflows", overflows["ListenOverflows"] == 0 and overflows["ListenDrops"] == 0,
              f"TcpExt ListenOverflows +{overflows['ListenOverflows']}, ListenDrops +{overflows['ListenDrops']} "
              f"during the load (a full accept queue drops SYNs: a client then waits >= 1 s); burst connect "
              f"p99 {burst['p99']} ms, max {burst['max']} ms")
    estimate = results.get("closed_loop_latency_estimate_s")
    note = ""
    if load["hangs"] and estimate is not None and estimate > cfg.hang_s / 2:
        note = (f" (the engine made {results['engine_tokens_per_s']:g} tok/s: a request waits ~{estimate:g} s in the "
                f"queue, so these may be queueing, not hangs; a quieter machine or a lighter load tells)")
    check("no_hangs", load["hangs"] == 0 and load["watchdog_cancelled_clients"] == 0,
          f"{load['hangs']} requests without progress for {cfg.hang_s:.0f} s {load['hang_phases'] or ''}".strip()
          + note)
    check("no_failed_requests", load["failed"] == 0,
          f"{load['failed']} {load['failed_reasons'] or ''}".strip())
    check("accepted_finished_or_cancelled", load["accepted_not_finished_or_cancelled"] == 0,
          f"{load['accepted_2xx']} accepted, {load['accepted_not_finished_or_cancelled']} neither finished nor "
          f"cancelled {load['lost_by_reason'] or ''}".strip())
    if not cfg.allow_429:
        check("no_429", load["rejected_429"] == 0, f"{load['rejected_429']} answered 429 (queue full)")
    check("did_work", load["finished"] > 0, f"{load['finished']} finished")
    settle = results["settle"]
    check("kv_blocks_freed", settle["idle"],
          f"after {settle['waited_s']} s: " + ("all blocks free, nothing pending/waiting/running" if settle["idle"]
                                               else "; ".join(settle["problems"])))
    errors = results["server_counters"]["finished_by_reason"].get('{finished_reason="error"}', 0)
    check("no_engine_errors", errors == 0, f"{errors:g} sequences finished with reason error")
    p99 = health["p99_ms"]
    health_failures = sum(health["failures"].values())
    check("health_p99", p99 is not None and p99 <= cfg.health_p99_ms and health_failures == 0,
          f"p50 {health['p50_ms']} ms, p99 {p99} ms, max {health['max_ms']} ms over {health['probes']} probes "
          f"(limit {cfg.health_p99_ms:g} ms); failures {health['failures'] or 0}")
    rss = results.get("rss_mb")
    if rss and rss["start"] is not None and rss["end"] is not None:
        limit = rss["start"] * (1 + cfg.rss_growth) + cfg.rss_slack_mb
        check("rss_back", rss["end"] <= limit,
              f"start {rss['start']} MB, peak {rss['peak']} MB, end {rss['end']} MB "
              f"(limit start x {1 + cfg.rss_growth:g} + {cfg.rss_slack_mb:g} MB = {limit:.1f} MB)")
    return checks


def add_queue_estimate(cfg, results):
    """The engine's generation rate during the load and what it implies for one closed-loop request:
    clients x mean max_tokens / tokens per second (the wait a hang threshold must stay above)."""
    tokens = results["server_counters"]["generation_tokens"]
    wall = results["load"]["wall_s"]
    if wall and tokens:
        rate = tokens / wall
        results["engine_tokens_per_s"] = round(rate, 1)
        results["closed_loop_latency_estimate_s"] = round(cfg.clients * (1 + cfg.max_tokens) / 2 / rate, 1)


def queue_estimate(cfg, results):
    if "engine_tokens_per_s" not in results:
        return "n/a"
    return (f"{results['engine_tokens_per_s']:.0f} tok/s; ~{results['closed_loop_latency_estimate_s']:.0f} s per "
            f"request at {cfg.clients} clients (hang threshold {cfg.hang_s:g} s)")


def soak_table(cfg, results):
    load, health = results["load"], results["health"]
    rss = results.get("rss_mb") or {}
    rows = [
        ("clients", cfg.clients),
        ("duration", f"{cfg.rounds} rounds" if cfg.rounds else f"{cfg.minutes:g} min"),
        ("wall (s)", load["wall_s"]),
        ("requests/s", load["requests_per_s"]),
        (None, None),
        ("connections opened", load["connections"]),
        ("connection failures", f"{load['connection_failures']} {load['connection_failure_reasons'] or ''}"),
        ("burst connect p50/p99/max ms", f"{load['burst_connect_ms']['p50']} / {load['burst_connect_ms']['p99']} / "
                                         f"{load['burst_connect_ms']['max']}"),
        ("listen overflows / drops", "n/a" if load.get("listen_overflows") is None else
         f"{load['listen_overflows']['ListenOverflows']} / {load['listen_overflows']['ListenDrops']}"),
        ("requests sent", load["sent"]),
        ("accepted (2xx)", load["accepted_2xx"]),
        ("finished", load["finished"]),
        ("cancelled (on purpose)", f"{load['cancelled']} {load['cancelled_by_point']}"),
        ("failed", f"{load['failed']} {load['failed_reasons'] or ''}"),
        ("429", load["rejected_429"]),
        ("hangs", f"{load['hangs']} {load['hang_phases'] or ''}"),
        ("accepted, not finished/cancelled", load["accepted_not_finished_or_cancelled"]),
        (None, None),
        ("/health probes", f"{health['probes']} (failures {health['failures'] or 0})"),
        ("/health p50 / p99 / max ms", f"{health['p50_ms']} / {health['p99_ms']} / {health['max_ms']}"),
        ("RSS start / peak / end MB", f"{rss.get('start')} / {rss.get('peak')} / {rss.get('end')}"
                                      f" (launch {rss.get('launch')})" if rss else "n/a (attached)"),
        ("engine tokens/s; queueing estimate", queue_estimate(cfg, results)),
        ("KV blocks after settle", f"{results['settle']['gauges'].get(BLOCKS_FREE)} free of "
                                   f"{results['settle']['gauges'].get(BLOCKS_TOTAL)}"),
        ("server finished by reason", {k.strip('{}').replace('finished_reason=', '').strip('"'): int(v) for k, v in
                                       results["server_counters"]["finished_by_reason"].items()}),
    ]
    if "http" in results["server_counters"]:
        http = results["server_counters"]["http"]
        rows.append(("server HTTP front after settle", f"open connections {http['open_connections_after']:g}, "
                     f"open requests {http['open_requests_after']:g}; during the load: refused "
                     f"{http['refused_connections']:g}, deadline closes {http['deadline_closes']:g}"))
    print_table("soak", rows)


async def one_shot(target, host_header, model_name, stream: bool, max_tokens: int, idx: int, hang_s: float,
                   deadline: float):
    """One request on a fresh connection, read to the end. Returns (ok, reason, seconds)."""
    start = time.monotonic()
    payload = {"model": model_name, "prompt": SENTENCES[idx % len(SENTENCES)], "max_tokens": max_tokens,
               "temperature": 0.0, "ignore_eos": True, "stream": stream}
    try:
        reader, writer = await open_conn(target, min(hang_s, max(0.1, deadline - time.monotonic())))
    except (OSError, asyncio.TimeoutError) as error:
        return False, "connect_" + type(error).__name__, time.monotonic() - start
    try:
        writer.write(build_request("POST", "/v1/completions", host_header, json.dumps(payload).encode(),
                                   keepalive=False))
        timeout = max(0.1, min(deadline - time.monotonic(), hang_s if stream else deadline - time.monotonic()))
        async with asyncio.timeout(timeout):
            status, headers = await read_head(reader)
        if status != 200:
            return False, f"http_{status}", time.monotonic() - start
        async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
            body = await read_body(reader, headers, hang_s)
        if stream:
            ok = b"data: [DONE]" in body
        else:
            try:
                ok = json.loads(body)["choices"][0]["finish_reason"] in ("stop", "length")
            except (ValueError, KeyError, IndexError, TypeError):
                ok = False
        return ok, "ok" if ok else "bad_body", time.monotonic() - start
    except asyncio.TimeoutError:
        return False, "timeout", time.monotonic() - start
    except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as error:
        return False, type(error).__name__, time.monotonic() - start
    finally:
        abort_writer(writer, rst=True)


async def burst_phase(cfg, target, host_header, model_name, stream: bool):
    deadline = time.monotonic() + cfg.phase_timeout
    start = time.monotonic()
    listen_before = listen_counters()
    results = await asyncio.gather(*[one_shot(target, host_header, model_name, stream, cfg.fixed_max_tokens, i,
                                              cfg.hang_s, deadline) for i in range(cfg.clients)])
    wall = time.monotonic() - start
    ok_times = [t for ok, _, t in results if ok]
    reasons = collections.Counter(r for ok, r, _ in results if not ok)
    return {"requests": cfg.clients, "ok": len(ok_times), "failed": dict(reasons), "wall_s": round(wall, 2),
            "last_ok_s": round(max(ok_times), 2) if ok_times else None,
            "latency_p50_s": _r(percentile(ok_times, 50), 2), "latency_p99_s": _r(percentile(ok_times, 99), 2),
            "timed_out": wall >= cfg.phase_timeout - 0.5,
            "listen_overflows": ({k: v - listen_before[k] for k, v in listen_counters().items()}
                                 if listen_before else None)}


async def stream_vs_whole_mode(cfg, server, target, host_header) -> dict:
    model_name, _ = await discover(target, host_header, argparse.Namespace(chat_fraction=0))
    results = {"model_name": model_name}
    probe = HealthProbe(*target_host_port(cfg, server), timeout=cfg.probe_timeout).start()
    for stream in (True, False):
        name = "stream" if stream else "whole"
        print(f"stream-vs-whole: {cfg.clients} {name} requests at once, max_tokens {cfg.fixed_max_tokens} "
              f"(ignore_eos), phase limit {cfg.phase_timeout:.0f} s", flush=True)
        results[name] = await burst_phase(cfg, target, host_header, model_name, stream)
        print(f"  {name}: {results[name]['ok']} ok in {results[name]['wall_s']} s {results[name]['failed'] or ''}",
              flush=True)
        idle, waited, _, problems = await wait_idle(target, host_header, cfg.settle_s)
        results[name]["idle_after"] = {"idle": idle, "waited_s": round(waited, 1), "problems": problems}
    results["health"] = probe.stop()
    s, w = results["stream"], results["whole"]
    results["ratio_whole_over_stream"] = round(w["wall_s"] / s["wall_s"], 3) if s["wall_s"] > 0 else None
    # A phase that timed out or lost requests gives only a bound.
    results["ratio_is_bound"] = w["timed_out"] or s["timed_out"] or w["ok"] < w["requests"] or s["ok"] < s["requests"]
    return results


def stream_vs_whole_checks(cfg, results, stop_info):
    checks = []
    s, w = results["stream"], results["whole"]
    ratio = results["ratio_whole_over_stream"]
    checks.append({"name": "all_streamed_ok", "passed": s["ok"] == s["requests"],
                   "detail": f"{s['ok']}/{s['requests']} {s['failed'] or ''}".strip()})
    checks.append({"name": "all_whole_ok", "passed": w["ok"] == w["requests"],
                   "detail": f"{w['ok']}/{w['requests']} {w['failed'] or ''}".strip()})
    checks.append({"name": "whole_within_ratio", "passed": ratio is not None and ratio <= cfg.max_ratio
                   and w["ok"] == w["requests"],
                   "detail": f"whole {w['wall_s']} s / stream {s['wall_s']} s = {ratio} (limit {cfg.max_ratio:g}"
                             f"{'; whole phase hit its ' + str(int(cfg.phase_timeout)) + ' s limit' if w['timed_out'] else ''})"})
    checks.append({"name": "kv_blocks_freed", "passed": s["idle_after"]["idle"] and w["idle_after"]["idle"],
                   "detail": "; ".join(s["idle_after"]["problems"] + w["idle_after"]["problems"]) or "idle after both"})
    if stop_info is not None:
        checks.append({"name": "no_crash", "passed": stop_info["exit_status"] == 0,
                       "detail": f"exit status {stop_info['exit_status']} after SIGTERM"})
    return checks


def target_host_port(cfg, server):
    if server:
        return server.host, server.port
    return parse_url(cfg.url)


# ---------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("soak", "stream-vs-whole"), default="soak")
    p.add_argument("--splitflow", type=Path, default=REPO / "build" / "splitflow", help="the splitflow binary")
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="model served (default stories260K-hf)")
    p.add_argument("--chat-template", type=Path, help="passed to the server (chat requests are sent when it has one)")
    p.add_argument("--server-arg", action="append", default=[], help="extra `splitflow serve` arguments (repeatable)")
    p.add_argument("--url", help="attach to a running server instead of starting one (no RSS or exit checks)")
    p.add_argument("--short", action="store_true", help="CI: 200 clients, 50 s of load, <= 2 minutes in all")
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--rounds", type=int, help="requests per client instead of --minutes")
    p.add_argument("--stream-fraction", type=float, default=0.5)
    p.add_argument("--chat-fraction", type=float, default=0.2, help="of requests, when the server has a template")
    p.add_argument("--disconnect-fraction", type=float, default=0.3, help="streams dropped on purpose")
    p.add_argument("--whole-disconnect-fraction", type=float, default=0.05,
                   help="whole requests dropped before their answer (0-1 s after sending)")
    p.add_argument("--slow-fraction", type=float, default=0.1, help="clients that read slowly (4 KiB buffers, pauses)")
    p.add_argument("--max-tokens", type=int, default=64, help="max_tokens drawn from 1..this")
    p.add_argument("--prompt-chars", type=int, default=400)
    p.add_argument("--hang-s", type=float, default=120.0,
                   help="no progress for this long is a hang (a queued request makes none: keep this well above "
                        "clients x mean max_tokens / the engine's tokens per second)")
    p.add_argument("--request-timeout", type=float, default=300.0,
                   help="one request taking longer than this in all is a hang")
    p.add_argument("--connect-timeout", type=float, default=30.0)
    p.add_argument("--warmup-s", type=float, default=15.0,
                   help="load before the measured run; RSS start is taken after it (0: none)")
    p.add_argument("--settle-s", type=float, default=30.0, help="time for the gauges to go idle after the load")
    p.add_argument("--rss-settle-s", type=float, default=2.0)
    p.add_argument("--rss-growth", type=float, default=0.10, help="allowed RSS growth end vs start")
    p.add_argument("--rss-slack-mb", type=float, default=16.0)
    p.add_argument("--health-p99-ms", type=float, default=100.0)
    p.add_argument("--probe-timeout", type=float, default=30.0)
    p.add_argument("--allow-429", action="store_true", help="do not fail on 429 (queue full)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fixed-max-tokens", type=int, default=64, help="stream-vs-whole: tokens per request")
    p.add_argument("--phase-timeout", type=float, default=300.0, help="stream-vs-whole: limit of each phase")
    p.add_argument("--max-ratio", type=float, default=1.5, help="stream-vs-whole: whole/stream limit")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory of the JSON record")
    p.add_argument("--no-json", action="store_true")
    p.add_argument("--label", default="", help="a name for this run in the JSON file name and record")
    args = p.parse_args(argv)
    if args.short:
        given = set(a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:]))
        if "--clients" not in given:
            args.clients = 200
        if "--minutes" not in given:
            args.minutes = 50 / 60.0
        if "--warmup-s" not in given:
            args.warmup_s = 8.0
        if "--hang-s" not in given:
            args.hang_s = 60.0
        if "--max-tokens" not in given:
            args.max_tokens = 16
        if "--settle-s" not in given:
            args.settle_s = 15.0
        if "--connect-timeout" not in given:
            args.connect_timeout = 15.0
        if "--request-timeout" not in given:
            args.request_timeout = 60.0
    return args


def main(argv=None) -> int:
    cfg = parse_args(argv)
    nofile = raise_nofile_limit()
    if nofile < cfg.clients + 512:
        print(f"soak: open-file limit {nofile} is below {cfg.clients} clients + 512", file=sys.stderr)
    server = None
    if not cfg.url:
        if not cfg.model.exists():
            print(f"soak: model {cfg.model} not found: skipped", file=sys.stderr)
            return 77
        server = start_server(cfg, cfg.clients)
        url = server.url
    else:
        url = cfg.url
    host, port = parse_url(url) if not server else (server.host, server.port)
    target = resolve(host, port)
    host_header = f"{host}:{port}"
    stop_info = None
    started = time.monotonic()
    load_start = list(os.getloadavg())
    try:
        asyncio.run(wait_healthy(target, host_header))
        if cfg.mode == "soak":
            results = asyncio.run(soak_mode(cfg, server, target, host_header))
        else:
            results = asyncio.run(stream_vs_whole_mode(cfg, server, target, host_header))
    except KeyboardInterrupt:
        if server:
            server.kill()
        return 130
    except Exception as error:
        import traceback
        traceback.print_exc()
        print(f"soak: aborted: {error}", file=sys.stderr)
        if server:
            print("server log tail:\n  " + "\n  ".join(list(server.log)[-20:]), file=sys.stderr)
            server.kill()
        return 2
    if server:
        status, seconds, killed = server.stop(timeout=60)
        stop_info = {"exit_status": status, "stop_s": round(seconds, 1), "killed": killed,
                     "log_tail": list(server.log)[-15:]}
        results["server_stop"] = stop_info

    checks = soak_checks(cfg, results, stop_info) if cfg.mode == "soak" else \
        stream_vs_whole_checks(cfg, results, stop_info)
    if cfg.mode == "soak":
        soak_table(cfg, results)
    else:
        s, w, h = results["stream"], results["whole"], results["health"]
        print_table("stream vs whole", [
            ("clients (at once)", cfg.clients), ("max_tokens (ignore_eos)", cfg.fixed_max_tokens),
            ("streamed: ok / wall s / p50 / p99 s", f"{s['ok']} / {s['wall_s']} / {s['latency_p50_s']} / "
                                                   f"{s['latency_p99_s']} {s['failed'] or ''}"),
            ("whole: ok / wall s / p50 / p99 s", f"{w['ok']} / {w['wall_s']} / {w['latency_p50_s']} / "
                                                f"{w['latency_p99_s']} {w['failed'] or ''}"),
            ("ratio whole / stream", f"{results['ratio_whole_over_stream']}"
                                     f"{' (not comparable: a phase timed out or lost requests)' if results['ratio_is_bound'] else ''}"),
            ("/health p50 / p99 / max ms", f"{h['p50_ms']} / {h['p99_ms']} / {h['max_ms']}")])
    print(f"machine load average (1/5/15 min) at start {record_load(load_start)}, at end {record_load(os.getloadavg())}")
    print_checks(checks)
    if server and not all(c["passed"] for c in checks):
        print("server log tail:\n  " + "\n  ".join(list(server.log)[-12:]))

    record = {
        "kind": "soak", "label": cfg.label, "mode": cfg.mode, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "device": cpu_model(), "cores": os.cpu_count(), "commit": git_commit(),
        "server": {"url": url, "started_by_script": server is not None,
                   "command": server.command if server else None,
                   "binary": binary_info(cfg.splitflow) if server else None},
        "parameters": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(cfg).items()},
        "open_file_limit": nofile,
        "load_average_start_end": [load_start, list(os.getloadavg())],
        "script_wall_s": round(time.monotonic() - started, 1),
        "results": results, "checks": checks, "passed": all(c["passed"] for c in checks),
    }
    if not cfg.no_json:
        stem = ("soak-short" if cfg.short else "soak") if cfg.mode == "soak" else "stream-vs-whole"
        path = write_json(cfg.out, f"{stem}-{cfg.clients}c" + (f"-{cfg.label}" if cfg.label else ""), record)
        print(f"wrote {path}")
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
