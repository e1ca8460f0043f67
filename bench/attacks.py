#!/usr/bin/env python3
"""Hostile-client measurements of `splitflow serve` (issue 24): each attack over raw sockets, with the
status code (or what happened to the connection) and the server's peak memory during it.

Python 3.11 standard library only. Starts its own server (stories260K-hf, CPU backend, a free
port; the server's defaults unless --server-arg says otherwise, plus a small connection cap for
attack g when `serve --help` offers one) and runs:

  a1  2,000 sockets sending their request headers a byte per second, held while /health is probed
      (every 50-100 ms, from another process): /health p99, and when the server closed them
  a2  the same with complete headers and a body sent a byte per second
  b   a 1 GiB chunked body sent as fast as possible
  c   a 1 MiB gzip body that inflates to 1 GiB (Content-Encoding: gzip)
  d1  512 MiB of header lines (4 KiB each); d2  100,000 small header lines
  e   two conflicting Content-Length headers
  f   Content-Length and Transfer-Encoding: chunked together
  g   1,000 connections at once beyond the connection cap (503 with Retry-After, or failures)
  h   1e999, -1e999 and 22-digit integers in every numeric field (400 naming the field)

Peak memory: VmHWM after resetting it (clear_refs) before each attack, minus the RSS then; the
target is at most the configured limit + 100 MB. Prints the table, writes JSON under
bench/results/attacks/ (or --out), exits 1 when an attack fails, 77 when the model is missing.

  bench/attacks.py --splitflow build/splitflow
  bench/attacks.py --only e,f,h                   # a subset
  bench/attacks.py --server-arg "--max-connections 256" --conn-cap 256
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import json
import os
import re
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import soak  # noqa: E402  (the shared helpers: server process, probe, HTTP reading)
from soak import _r, abort_writer, open_conn, percentile, read_head, resolve  # noqa: E402

REPO = soak.REPO
RESULTS_DIR = REPO / "bench" / "results" / "attacks"
MiB = 1 << 20
GiB = 1 << 30
VALID_JSON = b'{"prompt":"Once","max_tokens":1}'

# What the new front's defaults are (src/http/http_front.h Limits/FrontConfig); overridable.
DEFAULT_LIMITS = {"header_bytes": 64 << 10, "header_count": 128, "body_bytes": 32 * MiB,
                  "header_timeout_s": 15.0, "body_timeout_s": 60.0}


class Attack:
    """One row of the table."""

    def __init__(self, key, name, expected):
        self.key, self.name, self.expected = key, name, expected
        self.got = ""
        self.passed = False
        self.details = {}
        self.peak_mb = None        # VmHWM during the attack
        self.peak_delta_mb = None  # minus the RSS before it
        self.mem_limit_mb = None
        self.seconds = None

    def record(self):
        return {"key": self.key, "attack": self.name, "expected": self.expected, "got": self.got,
                "passed": self.passed, "peak_rss_mb": _r(self.peak_mb), "peak_rss_delta_mb": _r(self.peak_delta_mb),
                "memory_limit_mb": _r(self.mem_limit_mb), "seconds": _r(self.seconds), "details": self.details}


# ---------------------------------------------------------------------------------------------
# Socket helpers
# ---------------------------------------------------------------------------------------------

class Responder:
    """Reads what the server sends on a connection while we write: the first response head (if any),
    when it came, and when the connection ended (EOF or reset)."""

    def __init__(self, reader, t0):
        self.reader, self.t0 = reader, t0
        self.status = None
        self.headers = {}
        self.head_at = None
        self.closed_at = None
        self.close_kind = None
        self.body = b""
        self.task = asyncio.ensure_future(self._run())

    async def _run(self):
        buffer = bytearray()
        try:
            while True:
                piece = await self.reader.read(65536)
                if not piece:
                    self.close_kind = "eof"
                    break
                if len(buffer) < 1 << 16:
                    buffer += piece
                if self.status is None and b"\r\n\r\n" in buffer:
                    end = buffer.index(b"\r\n\r\n") + 4
                    try:
                        self.status, self.headers = soak.parse_head(bytes(buffer[:end]))
                    except ValueError:
                        self.status = -1
                    self.head_at = time.monotonic() - self.t0
                    self.body = bytes(buffer[end:end + 400])
                elif self.status is not None and len(self.body) < 400:
                    self.body = (self.body + piece)[:400]
        except (ConnectionResetError, BrokenPipeError):
            self.close_kind = "reset"
        except OSError as error:
            self.close_kind = type(error).__name__
        except asyncio.CancelledError:
            raise
        self.closed_at = time.monotonic() - self.t0

    async def wait(self, timeout):
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout)
        except asyncio.TimeoutError:
            pass

    def cancel(self):
        self.task.cancel()

    def summary(self):
        parts = []
        if self.status is not None:
            parts.append(str(self.status))
            if self.status == 503 and "retry-after" in self.headers:
                parts[-1] += f" Retry-After: {self.headers['retry-after'][-1]}"
        if self.closed_at is not None:
            parts.append(f"closed ({self.close_kind}) at {self.closed_at:.1f} s")
        return ", ".join(parts) or "no answer"


def message_of(body: bytes) -> str:
    try:
        value = json.loads(body)
        if not isinstance(value, dict) or not isinstance(value.get("error"), dict):
            return ""
        error = value["error"]
        return json.dumps({k: error.get(k) for k in ("message", "param", "code") if k in error})[:200]
    except (ValueError, AttributeError):
        return body[:160].decode("utf-8", "replace")


async def blast(target, head: bytes, body_source, total_timeout: float, host_header: str):
    """Sends head then the pieces body_source yields, as fast as the socket takes them, while reading
    the answer. Stops at the first write error or when the server has answered and closed.
    Returns (responder, bytes sent, write error or None, seconds)."""
    t0 = time.monotonic()
    reader, writer = await open_conn(target, 30)
    responder = Responder(reader, t0)
    sent = 0
    error = None
    try:
        async with asyncio.timeout(total_timeout):
            writer.write(head)
            await writer.drain()
            sent += len(head)
            for piece in body_source:
                if responder.closed_at is not None:
                    error = "server closed before the end"
                    break
                writer.write(piece)
                await writer.drain()
                sent += len(piece)
            else:
                pass
        await responder.wait(min(30.0, max(1.0, total_timeout - (time.monotonic() - t0))))
    except asyncio.TimeoutError:
        error = f"not done within {total_timeout:.0f} s"
    except (ConnectionResetError, BrokenPipeError) as e:
        error = type(e).__name__
        await responder.wait(2.0)
    except OSError as e:
        error = type(e).__name__
        await responder.wait(2.0)
    finally:
        responder.cancel()
        abort_writer(writer, rst=True)
    return responder, sent, error, time.monotonic() - t0


async def simple_exchange(target, raw: bytes, timeout: float = 30.0, check_close: float = 3.0):
    """Writes a raw request; returns (status, headers, body, closed_after) where closed_after says
    whether the server closed the connection within check_close seconds of the response."""
    reader, writer = await open_conn(target, timeout)
    try:
        writer.write(raw)
        await writer.drain()
        async with asyncio.timeout(timeout):
            status, headers = await read_head(reader)
        try:
            body = await soak.read_body(reader, headers, timeout)
        except (asyncio.IncompleteReadError, OSError, ValueError) as error:
            body = f"<body unreadable: {type(error).__name__}>".encode()
        closed = False
        try:
            async with asyncio.timeout(check_close):
                rest = await reader.read(65536)
            closed = rest == b""
        except asyncio.TimeoutError:
            closed = False
        except OSError:
            closed = True
        return status, headers, body, closed
    finally:
        abort_writer(writer, rst=False)


def request_head(path: str, host_header: str, headers) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host_header}", "Content-Type: application/json", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# ---------------------------------------------------------------------------------------------
# Attacks
# ---------------------------------------------------------------------------------------------

async def attack_slow(ctx, attack: Attack, n: int, kind: str, deadline_s: float):
    """n sockets sending a byte per second: kind 'header' (headers never end) or 'body' (complete
    headers, a Content-Length body a byte a second)."""
    target, host_header = ctx.target, ctx.host_header
    probe = soak.HealthProbe(ctx.server.host, ctx.server.port, timeout=ctx.cfg.probe_timeout).start()
    await asyncio.sleep(0.3)
    hold_s = ctx.cfg.slow_hold_s or (deadline_s + ctx.cfg.deadline_tolerance_s + 10)
    if kind == "header":
        prefix = f"POST /v1/completions HTTP/1.1\r\nHost: {host_header}\r\nX-Slow: ".encode()
        first = b""  # the whole request goes a byte at a time
        drip = prefix + b"a" * 100000
    else:
        first = request_head("/v1/completions", host_header, ["Content-Length: 100000"])
        drip = (b" " * 100000)
    closes = []          # seconds from connect to the server's close
    close_kinds = collections.Counter()
    statuses = collections.Counter()
    connect_failures = collections.Counter()
    opened = 0
    stop = asyncio.Event()

    async def one(i):
        nonlocal opened
        try:
            reader, writer = await open_conn(target, 30)
        except (OSError, asyncio.TimeoutError) as error:
            connect_failures[type(error).__name__] += 1
            return
        opened += 1
        t0 = time.monotonic()
        responder = Responder(reader, t0)
        try:
            if first:
                writer.write(first)
            for b in range(len(drip)):
                if responder.closed_at is not None or stop.is_set():
                    break
                writer.write(drip[b:b + 1])
                try:
                    async with asyncio.timeout(5):
                        await writer.drain()
                except (asyncio.TimeoutError, OSError):
                    break
                try:
                    async with asyncio.timeout(1.0):
                        await asyncio.shield(responder.task)
                except asyncio.TimeoutError:
                    pass
            if responder.closed_at is None and not stop.is_set():
                await responder.wait(5)
            if responder.closed_at is not None:
                closes.append(responder.closed_at)
                close_kinds[responder.close_kind] += 1
            if responder.status is not None:
                statuses[responder.status] += 1
        finally:
            responder.cancel()
            abort_writer(writer, rst=True)

    start = time.monotonic()
    tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
    done, pending = await asyncio.wait(tasks, timeout=hold_s)
    stop.set()
    await asyncio.wait(tasks, timeout=30)
    health = probe.stop()
    still_open = opened - len(closes)
    limit = deadline_s + ctx.cfg.deadline_tolerance_s
    late = sum(1 for c in closes if c > limit)
    early = sum(1 for c in closes if c < deadline_s - ctx.cfg.deadline_tolerance_s)
    attack.details = {"sockets": n, "opened": opened, "connect_failures": dict(connect_failures),
                      "closed_by_server": len(closes), "still_open_at_end": still_open,
                      "held_s": round(time.monotonic() - start, 1),
                      "close_s": {"min": _r(min(closes) if closes else None), "p50": _r(percentile(closes, 50)),
                                  "max": _r(max(closes) if closes else None)},
                      "closed_after_deadline_tolerance": late, "closed_before_deadline_tolerance": early,
                      "statuses_before_close": {str(k): v for k, v in statuses.items()},
                      "close_kinds": dict(close_kinds),
                      "deadline_expected_s": deadline_s, "health": health}
    health_ok = health["p99_ms"] is not None and health["p99_ms"] <= ctx.cfg.health_p99_ms and not health["failures"]
    all_closed = still_open == 0 and late == 0 and early == 0 and opened == n
    attack.got = (f"closed {len(closes)}/{opened}{' ' + str(dict(close_kinds)) if close_kinds else ''} (p50 {_r(percentile(closes, 50))} s, max "
                  f"{_r(max(closes) if closes else None)} s{', statuses ' + str(dict(statuses)) if statuses else ''})"
                  f"; /health p99 {health['p99_ms']} ms max {health['max_ms']} ms"
                  f"{' failures ' + str(health['failures']) if health['failures'] else ''}")
    attack.passed = health_ok and all_closed


def body_pieces(total: int, tail: bytes, piece: int = MiB, chunked: bool = True):
    blank = b" " * piece
    framed = (b"%x\r\n" % piece) + blank + b"\r\n" if chunked else blank
    sent = 0
    while sent + piece <= total:
        yield framed
        sent += piece
    if chunked:
        yield (b"%x\r\n" % len(tail)) + tail + b"\r\n0\r\n\r\n"
    else:
        yield tail


async def attack_chunked(ctx, attack: Attack):
    total = int(ctx.cfg.chunked_gib * GiB)
    head = request_head("/v1/completions", ctx.host_header, ["Transfer-Encoding: chunked"])
    responder, sent, error, seconds = await blast(ctx.target, head, body_pieces(total, VALID_JSON), 180, ctx.host_header)
    attack.details = {"body_bytes": total, "sent_bytes": sent, "write_error": error, "status": responder.status,
                      "answer_at_s": _r(responder.head_at), "closed_at_s": _r(responder.closed_at),
                      "message": message_of(responder.body)}
    attack.got = f"{responder.summary()}; {sent / MiB:.0f} MiB sent" + (f" ({error})" if error else "")
    attack.mem_limit_mb = ctx.limits["body_bytes"] / MiB
    attack.passed = responder.status == 413 and sent < total


_GZIP_CACHE = {}


def gzip_bomb(inflated: int) -> bytes:
    if inflated not in _GZIP_CACHE:
        comp = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip wrapper
        out = []
        blank = b" " * MiB
        for _ in range(inflated // MiB):
            out.append(comp.compress(blank))
        out.append(comp.compress(VALID_JSON))
        out.append(comp.flush())
        _GZIP_CACHE[inflated] = b"".join(out)
    return _GZIP_CACHE[inflated]


async def attack_gzip(ctx, attack: Attack):
    inflated = int(ctx.cfg.gzip_gib * GiB)
    bomb = await asyncio.get_running_loop().run_in_executor(None, gzip_bomb, inflated)
    head = request_head("/v1/completions", ctx.host_header, ["Content-Encoding: gzip", f"Content-Length: {len(bomb)}"])
    responder, sent, error, seconds = await blast(ctx.target, head, [bomb], 180, ctx.host_header)
    attack.details = {"compressed_bytes": len(bomb), "inflated_bytes": inflated + len(VALID_JSON), "sent_bytes": sent,
                      "write_error": error, "status": responder.status, "message": message_of(responder.body)}
    attack.got = f"{responder.summary()}; {len(bomb) / MiB:.2f} MiB gzip" + (f" ({error})" if error else "")
    attack.mem_limit_mb = ctx.limits["body_bytes"] / MiB
    attack.passed = responder.status in (415, 413)


def header_pieces(total: int, line_value: int, tail_body: bytes):
    value = b"a" * line_value
    sent, i = 0, 0
    batch = []
    while sent < total:
        line = b"X-Pad-%d: " % i + value + b"\r\n"
        batch.append(line)
        sent += len(line)
        i += 1
        if len(batch) >= 256:
            yield b"".join(batch)
            batch = []
    if batch:
        yield b"".join(batch)
    yield f"Content-Length: {len(tail_body)}\r\n\r\n".encode() + tail_body


async def attack_big_headers(ctx, attack: Attack):
    total = int(ctx.cfg.header_mib * MiB)
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {ctx.host_header}\r\nContent-Type: application/json\r\n".encode()
    responder, sent, error, seconds = await blast(ctx.target, head, header_pieces(total, 4000, VALID_JSON), 300,
                                                  ctx.host_header)
    attack.details = {"header_bytes": total, "sent_bytes": sent, "write_error": error, "status": responder.status,
                      "answer_at_s": _r(responder.head_at), "message": message_of(responder.body)}
    attack.got = f"{responder.summary()}; {sent / MiB:.1f} MiB sent" + (f" ({error})" if error else "")
    attack.mem_limit_mb = ctx.limits["header_bytes"] / MiB
    attack.passed = responder.status in (431, 400, 413) and sent < total


async def attack_many_headers(ctx, attack: Attack):
    n = ctx.cfg.header_lines

    def pieces():
        batch = []
        for i in range(n):
            batch.append(b"X-H%d: 1\r\n" % i)
            if len(batch) >= 1000:
                yield b"".join(batch)
                batch = []
        if batch:
            yield b"".join(batch)
        yield f"Content-Length: {len(VALID_JSON)}\r\n\r\n".encode() + VALID_JSON

    head = f"POST /v1/completions HTTP/1.1\r\nHost: {ctx.host_header}\r\nContent-Type: application/json\r\n".encode()
    responder, sent, error, seconds = await blast(ctx.target, head, pieces(), 120, ctx.host_header)
    attack.details = {"header_lines": n, "sent_bytes": sent, "write_error": error, "status": responder.status,
                      "message": message_of(responder.body)}
    attack.got = f"{responder.summary()}; {sent / MiB:.2f} MiB sent" + (f" ({error})" if error else "")
    attack.mem_limit_mb = ctx.limits["header_bytes"] / MiB
    attack.passed = responder.status in (431, 400)


async def attack_conflicting_length(ctx, attack: Attack):
    body = VALID_JSON + b" "
    raw = request_head("/v1/completions", ctx.host_header,
                       [f"Content-Length: {len(VALID_JSON)}", f"Content-Length: {len(body)}"]) + body
    status, headers, rbody, closed = await simple_exchange(ctx.target, raw)
    attack.details = {"status": status, "message": message_of(rbody), "closed_after": closed}
    attack.got = f"{status} {message_of(rbody)}"[:120]
    attack.passed = status == 400


async def attack_length_and_chunked(ctx, attack: Attack):
    chunked = (b"%x\r\n" % len(VALID_JSON)) + VALID_JSON + b"\r\n0\r\n\r\n"
    raw = request_head("/v1/completions", ctx.host_header,
                       [f"Content-Length: {len(chunked)}", "Transfer-Encoding: chunked"]) + chunked
    status, headers, rbody, closed = await simple_exchange(ctx.target, raw)
    attack.details = {"status": status, "message": message_of(rbody), "closed_after": closed}
    attack.got = f"{status}, connection {'closed' if closed else 'kept open'}: {message_of(rbody)}"[:120]
    # RFC 9112 6.3: reject, or take the chunked framing and close the connection after answering.
    attack.passed = status == 400 or (200 <= status < 300 and closed)


async def attack_connection_cap(ctx, attack: Attack):
    cap, burst = ctx.conn_cap, ctx.cfg.burst
    held = []
    hold_failures = collections.Counter()
    if cap:
        async def hold():
            try:
                held.append(await open_conn(ctx.target, 30))
            except (OSError, asyncio.TimeoutError) as error:
                hold_failures[type(error).__name__] += 1
        await asyncio.gather(*[hold() for _ in range(cap)])
        await asyncio.sleep(1.0)  # every held connection accepted
    outcomes = collections.Counter()
    retry_after = collections.Counter()
    latencies = []

    async def one():
        t0 = time.monotonic()
        try:
            reader, writer = await open_conn(ctx.target, 30)
        except asyncio.TimeoutError:
            outcomes["connect_timeout"] += 1
            return
        except OSError as error:
            outcomes["connect_" + type(error).__name__] += 1
            return
        try:
            writer.write(f"GET /health HTTP/1.1\r\nHost: {ctx.host_header}\r\nConnection: close\r\n\r\n".encode())
            async with asyncio.timeout(30):
                status, headers = await read_head(reader)
            latencies.append(time.monotonic() - t0)
            if status == 503:
                if "retry-after" in headers:
                    outcomes["503_retry_after"] += 1
                    retry_after[headers["retry-after"][-1]] += 1
                else:
                    outcomes["503_without_retry_after"] += 1
            else:
                outcomes[str(status)] += 1
        except asyncio.TimeoutError:
            outcomes["timeout"] += 1
        except asyncio.IncompleteReadError:
            outcomes["eof_before_status"] += 1
        except ConnectionResetError:
            outcomes["reset"] += 1
        except (OSError, ValueError) as error:
            outcomes[type(error).__name__] += 1
        finally:
            abort_writer(writer, rst=False)

    await asyncio.gather(*[one() for _ in range(burst)])
    for _, writer in held:
        abort_writer(writer, rst=True)
    answered = sum(v for k, v in outcomes.items() if k[0].isdigit())
    failures = burst - answered
    attack.details = {"connection_cap": cap, "held": len(held), "hold_failures": dict(hold_failures),
                      "burst": burst, "outcomes": dict(outcomes), "retry_after_values": dict(retry_after),
                      "answer_s": {"p50": _r(percentile(latencies, 50), 3), "max": _r(max(latencies) if latencies
                                                                                      else None, 3)}}
    attack.got = ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items()))
    if cap:
        attack.passed = outcomes["503_retry_after"] == burst and failures == 0
    else:
        attack.got = "the server has no connection cap: " + attack.got
        attack.passed = False


NUMERIC_FIELDS = ["max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "n", "presence_penalty",
                  "frequency_penalty", "repetition_penalty", "logprobs"]
BAD_NUMBERS = ["1e999", "-1e999", "1234567890123456789012", "-1234567890123456789012"]


async def attack_numbers(ctx, attack: Attack):
    cases = []
    for field in NUMERIC_FIELDS:
        for number in BAD_NUMBERS:
            if field == "max_tokens":
                body = f'{{"prompt":"Once","max_tokens":{number}}}'
            else:
                body = f'{{"prompt":"Once","max_tokens":1,"{field}":{number}}}'
            cases.append(("/v1/completions", field, number, body))
    for number in BAD_NUMBERS:  # one chat field (the body is checked before the template)
        cases.append(("/v1/chat/completions", "max_completion_tokens", number,
                      f'{{"messages":[{{"role":"user","content":"Hi"}}],"max_completion_tokens":{number}}}'))
    results = []
    for path, field, number, body in cases:
        raw = request_head(path, ctx.host_header, [f"Content-Length: {len(body)}", "Connection: close"]) + body.encode()
        try:
            status, _, rbody, _ = await simple_exchange(ctx.target, raw, check_close=0.0)
            try:
                param = json.loads(rbody)["error"].get("param")
            except (ValueError, KeyError, TypeError, AttributeError):
                param = None
        except (OSError, asyncio.TimeoutError, ValueError, asyncio.IncompleteReadError) as error:
            status, param, rbody = None, None, repr(error).encode()
        ok = status == 400 and param == field
        results.append({"path": path, "field": field, "value": number, "status": status, "param": param, "ok": ok})
    bad = [r for r in results if not r["ok"]]
    statuses = collections.Counter(str(r["status"]) for r in results)
    attack.details = {"cases": results}
    attack.got = (f"{len(results) - len(bad)}/{len(results)} 400 naming the field; statuses {dict(statuses)}"
                  + (f"; e.g. {bad[0]['field']}={bad[0]['value']} -> {bad[0]['status']} param {bad[0]['param']}"
                     if bad else ""))
    attack.passed = not bad


# ---------------------------------------------------------------------------------------------

ATTACKS = [
    ("a1", "2,000 slow sockets: headers a byte/s", "closed at the header deadline; /health p99 <= 100 ms"),
    ("a2", "slow sockets: body a byte/s", "closed at the body deadline; /health p99 <= 100 ms"),
    ("b", "1 GiB chunked body, fast", "413 early; peak <= body limit + 100 MB"),
    ("c", "1 MiB gzip -> 1 GiB", "415 (or 413); peak <= body limit + 100 MB"),
    ("d1", "512 MiB of headers", "431 early; peak <= header limit + 100 MB"),
    ("d2", "100k small header lines", "431; peak <= header limit + 100 MB"),
    ("e", "two conflicting Content-Length", "400"),
    ("f", "Content-Length + chunked", "400 (or chunked, then close)"),
    ("g", "1,000 connections beyond the cap", "503 + Retry-After each, 0 failures"),
    ("h", "1e999 / -1e999 / 22 digits in numbers", "400 naming the field"),
]


def help_defaults(binary: str) -> dict:
    """{flag: default} from `splitflow serve --help` (CLI11 prints `--flag TYPE...=default`)."""
    import subprocess
    try:
        text = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    out = {}
    for line in text.splitlines():
        match = re.match(r"\s*(?:-\w,)?(--[a-z][a-z0-9-]*)\b[^=\n]*=(\S+)", line)
        if match:
            out[match.group(1)] = match.group(2)
    return out


class Context:
    def __init__(self, cfg):
        self.cfg = cfg
        self.server = None
        self.extra = None
        binary = str(cfg.splitflow)
        self.flags = soak.serve_help_flags(binary)
        self.defaults = help_defaults(binary)
        self.base_args = ["--model", str(cfg.model), "--port", "0", "--host", "127.0.0.1"]
        if "--backend" in self.flags:
            self.base_args += ["--backend", "cpu"]
        for extra in cfg.server_arg:
            self.base_args += extra.split()
        given = dict(zip(self.base_args, self.base_args[1:]))

        def setting(flag):
            return given.get(flag, self.defaults.get(flag))

        self.limits = dict(DEFAULT_LIMITS)
        for key, flag, scale in (("header_bytes", "--max-header-bytes", 1), ("header_count", "--max-header-count", 1),
                                 ("body_bytes", "--max-body-mb", MiB), ("header_timeout_s", "--header-timeout", 1),
                                 ("body_timeout_s", "--body-timeout", 1)):
            value = setting(flag)
            if value is not None:
                try:
                    self.limits[key] = float(value) * scale
                except ValueError:
                    pass
        for key in ("header_bytes", "body_bytes", "header_timeout_s", "body_timeout_s"):
            value = getattr(cfg, key)
            if value is not None:
                self.limits[key] = value
        # Attack g runs on a server with a small cap (when this build has the flag), so that the held
        # connections and the burst beyond stay cheap; the other attacks keep the configured cap.
        self.conn_cap = cfg.conn_cap
        self.cap_args = []
        if "--max-connections" in given:
            self.conn_cap = int(given["--max-connections"])
        elif "--max-connections" in self.flags:
            self.conn_cap = self.conn_cap or 256
            self.cap_args = ["--max-connections", str(self.conn_cap)]
        self.server_commands = []

    def ensure(self, extra):
        if self.server is not None and self.extra == extra and self.server.alive():
            return
        if self.server is not None:
            self.server.stop(timeout=60)
        self.extra = extra
        self.server = soak.ServerProcess(str(self.cfg.splitflow), self.base_args + extra)
        self.server_commands.append(self.server.command)
        self.target = resolve(self.server.host, self.server.port)
        self.host_header = f"{self.server.host}:{self.server.port}"
        asyncio.run(soak.wait_healthy(self.target, self.host_header))


async def healthy(ctx, timeout=10.0) -> bool:
    try:
        status, _, _ = await soak.http_get(ctx.target, ctx.host_header, "/health", timeout)
        return status == 200
    except (OSError, asyncio.TimeoutError, ValueError, asyncio.IncompleteReadError):
        return False


def run_attack(ctx, key, name, expected) -> Attack:
    attack = Attack(key, name, expected)
    cfg = ctx.cfg
    runners = {
        "a1": lambda: attack_slow(ctx, attack, cfg.slow_sockets, "header", ctx.limits["header_timeout_s"]),
        "a2": lambda: attack_slow(ctx, attack, cfg.slow_body_sockets, "body", ctx.limits["body_timeout_s"]),
        "b": lambda: attack_chunked(ctx, attack),
        "c": lambda: attack_gzip(ctx, attack),
        "d1": lambda: attack_big_headers(ctx, attack),
        "d2": lambda: attack_many_headers(ctx, attack),
        "e": lambda: attack_conflicting_length(ctx, attack),
        "f": lambda: attack_length_and_chunked(ctx, attack),
        "g": lambda: attack_connection_cap(ctx, attack),
        "h": lambda: attack_numbers(ctx, attack),
    }
    if key == "a1":
        attack.name = f"{cfg.slow_sockets:,} slow sockets: headers a byte/s"
    if key == "a2":
        attack.name = f"{cfg.slow_body_sockets:,} slow sockets: body a byte/s"
    if key == "g":
        attack.name = f"{cfg.burst:,} connections beyond the cap" + (f" ({ctx.conn_cap})" if ctx.conn_cap else "")
    ctx.ensure(ctx.cap_args if key == "g" else [])
    print(f"attack {key}: {attack.name} ...", flush=True)
    time.sleep(0.5)
    base = ctx.server.rss_mb()
    reset = ctx.server.reset_hwm()
    sampler = soak.RssSampler(ctx.server.pid, 0.05)
    sampler.start()
    start = time.monotonic()
    try:
        asyncio.run(asyncio.wait_for(runners[key](), cfg.attack_timeout))
    except asyncio.TimeoutError:
        attack.got = (attack.got + "; " if attack.got else "") + f"attack script timed out after {cfg.attack_timeout} s"
        attack.passed = False
    except Exception as error:  # a script bug must not hide the other attacks
        import traceback
        traceback.print_exc()
        attack.got = f"script error: {error!r}"
        attack.passed = False
    attack.seconds = time.monotonic() - start
    time.sleep(0.5)
    sampler.stop()
    hwm = ctx.server.hwm_mb() if reset else None
    attack.peak_mb = max(x for x in (hwm, sampler.peak_mb) if x is not None) if (hwm or sampler.peak_mb) else None
    attack.peak_delta_mb = (attack.peak_mb - base) if attack.peak_mb is not None and base is not None else None
    attack.details["rss_before_mb"] = _r(base)
    attack.details["hwm_reset"] = reset
    if attack.mem_limit_mb is not None and attack.peak_delta_mb is not None:
        within = attack.peak_delta_mb <= attack.mem_limit_mb + cfg.mem_slack_mb
        attack.details["memory_within_limit"] = within
        if not within:
            attack.passed = False
            attack.got += f"; peak +{attack.peak_delta_mb:.0f} MB > {attack.mem_limit_mb:.3g} + {cfg.mem_slack_mb:.0f} MB"
    alive = ctx.server.alive()
    ok = alive and asyncio.run(healthy(ctx))
    attack.details["server_alive_after"] = alive
    attack.details["health_after"] = ok
    if not alive:
        attack.passed = False
        attack.got += f"; SERVER EXITED (status {ctx.server.proc.poll()})"
        attack.details["server_log_tail"] = list(ctx.server.log)[-15:]
        print("  server log tail:\n    " + "\n    ".join(list(ctx.server.log)[-8:]), flush=True)
    elif not ok:
        attack.passed = False
        attack.got += "; /health not 200 after the attack"
    print(f"  -> {'PASS' if attack.passed else 'FAIL'}: {attack.got} (peak +{_r(attack.peak_delta_mb)} MB, "
          f"{attack.seconds:.1f} s)", flush=True)
    if not ok:
        print("  restarting the server", flush=True)
        ctx.server.kill()
        ctx.ensure(ctx.extra)
    return attack


def print_attack_table(attacks):
    headers = ("", "attack", "expected", "got", "peak RSS MB (+delta)", "")
    rows = []
    for a in attacks:
        peak = "n/a" if a.peak_mb is None else f"{a.peak_mb:.0f} (+{a.peak_delta_mb:.0f})"
        rows.append((a.key, a.name, a.expected, a.got, peak, "PASS" if a.passed else "FAIL"))
    widths = [min(max(len(str(r[i])) for r in rows + [headers]), cap) for i, cap in
              enumerate((3, 42, 46, 200, 22, 4))]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    print("\n" + line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--splitflow", type=Path, default=REPO / "build" / "splitflow")
    p.add_argument("--model", type=Path, default=soak.DEFAULT_MODEL)
    p.add_argument("--server-arg", action="append", default=[], help="extra `splitflow serve` arguments (repeatable)")
    p.add_argument("--only", help="comma-separated attack keys (a1,a2,b,c,d1,d2,e,f,g,h)")
    p.add_argument("--slow-sockets", type=int, default=2000)
    p.add_argument("--slow-body-sockets", type=int, default=2000)
    p.add_argument("--slow-hold-s", type=float, default=None,
                   help="how long slow sockets are held (default: their deadline + tolerance + 10 s)")
    p.add_argument("--deadline-tolerance-s", type=float, default=5.0)
    p.add_argument("--header-timeout-s", type=float, help="the server's header deadline (default 15)")
    p.add_argument("--body-timeout-s", type=float, help="the server's body deadline (default 60)")
    p.add_argument("--header-bytes", type=int, help="the server's header limit (default 64 KiB)")
    p.add_argument("--body-bytes", type=int, help="the server's body limit (default 32 MiB)")
    p.add_argument("--chunked-gib", type=float, default=1.0)
    p.add_argument("--gzip-gib", type=float, default=1.0)
    p.add_argument("--header-mib", type=float, default=512.0)
    p.add_argument("--header-lines", type=int, default=100000)
    p.add_argument("--burst", type=int, default=1000)
    p.add_argument("--conn-cap", type=int, help="the server's connection cap (default: 256 when it has "
                                                "--max-connections, else none)")
    p.add_argument("--health-p99-ms", type=float, default=100.0)
    p.add_argument("--probe-timeout", type=float, default=30.0)
    p.add_argument("--mem-slack-mb", type=float, default=100.0)
    p.add_argument("--attack-timeout", type=float, default=400.0)
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    p.add_argument("--label", default="", help="a name for this run in the JSON file name and record")
    p.add_argument("--no-json", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    cfg = parse_args(argv)
    nofile = soak.raise_nofile_limit()
    need = max(cfg.slow_sockets, cfg.slow_body_sockets, cfg.burst + (cfg.conn_cap or 256)) + 256
    if nofile < need:
        print(f"attacks: open-file limit {nofile} < {need}: socket counts will be short", file=sys.stderr)
    if not cfg.model.exists():
        print(f"attacks: model {cfg.model} not found: skipped", file=sys.stderr)
        return 77
    if not os.access(cfg.splitflow, os.X_OK):
        print(f"attacks: no splitflow binary at {cfg.splitflow}", file=sys.stderr)
        return 2
    ctx = Context(cfg)
    print(f"attacks: {cfg.splitflow} serve {' '.join(ctx.base_args)}; limits {ctx.limits}; "
          f"connection cap for g: {ctx.conn_cap}", flush=True)
    load_start = list(os.getloadavg())
    keys = cfg.only.split(",") if cfg.only else [k for k, _, _ in ATTACKS]
    attacks = []
    started = time.monotonic()
    status = seconds = killed = None
    try:
        for key, name, expected in ATTACKS:
            if key in keys:
                attacks.append(run_attack(ctx, key, name, expected))
    except RuntimeError as error:  # the server does not start
        print(f"attacks: {error}", file=sys.stderr)
        return 2
    finally:
        if ctx.server is not None:
            status, seconds, killed = ctx.server.stop(timeout=60)
    print_attack_table(attacks)
    failed = [a.key for a in attacks if not a.passed]
    print(("FAILED attacks: " + ", ".join(failed)) if failed else "all attacks answered as expected")
    record = {
        "kind": "attacks", "label": cfg.label, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "device": soak.cpu_model(), "cores": os.cpu_count(), "commit": soak.git_commit(),
        "server": {"commands": ctx.server_commands, "binary": soak.binary_info(cfg.splitflow),
                   "exit_status_after_sigterm": status, "killed": killed},
        "load_average_start_end": [load_start, list(os.getloadavg())],
        "limits_assumed": ctx.limits, "connection_cap": ctx.conn_cap, "open_file_limit": nofile,
        "parameters": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(cfg).items()},
        "script_wall_s": round(time.monotonic() - started, 1),
        "attacks": [a.record() for a in attacks], "passed": not failed,
    }
    if not cfg.no_json:
        path = soak.write_json(cfg.out, "attacks" + (f"-{cfg.label}" if cfg.label else ""), record)
        print(f"wrote {path}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
