#!/usr/bin/env python3
"""The chat page at GET / (server/chat_page.html) in headless Chromium against `splitflow serve`.

Starts the server on stories260K-hf (the Llama 3.1 chat template) with --api-key, opens the page
in Chromium driven over the DevTools protocol (--remote-debugging-pipe: JSON messages separated by
NUL bytes on file descriptors 3 and 4, so nothing beyond the standard library is needed), and checks:
  1. without the key the page shows the server's 401 message and streams nothing;
  2. with ?key=... and ?q=..., the page streams an answer into the DOM: the assistant's message
     equals the server's own greedy answer to the same conversation (asked over HTTP, not
     streamed), and the stats line shows a token count and tokens/s;
  3. a second turn typed into the page (input + Enter) sends the whole conversation: its answer
     equals the server's answer to the two-turn conversation;
  4. the Stop button aborts a long reply: the page marks it stopped and the server frees its
     sequence (no request left running in /metrics).
Exit status 77 (skipped) without chromium or the model.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

KEY = "page-test-key"


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


class Chromium:
    """Headless Chromium over --remote-debugging-pipe (CDP: fd 3 commands in, fd 4 replies out)."""

    def __init__(self, binary, profile):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The child must see the pipes as fds 3 and 4 (copied out of the way first, in case a pipe
        # already sits on one of them); subprocess closes every other fd after this runs.
        def child_fds():
            commands, replies = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(commands, 3)
            os.dup2(replies, 4)
        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
            preexec_fn=child_fds, pass_fds=(3, 4),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.session = None

    def command(self, method, params=None, session=True, timeout=30):
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._next_id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply.get("result", {})
            if time.time() > deadline:
                raise TimeoutError(f"{method}: no reply in {timeout} s")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buffer += chunk

    def open(self, url):
        target = self.command("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.command("Target.attachToTarget", {"targetId": target, "flatten": True},
                                    session=False)["sessionId"]
        self.command("Page.navigate", {"url": url})

    def evaluate(self, expression):
        result = self.command("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                   "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError:
                value = None  # the page is still loading
            if value:
                return value
            time.sleep(0.1)
        fail(f"timed out waiting for `{expression}`; the page shows: {self.dom_summary()}")

    def dom_summary(self):
        return self.evaluate("JSON.stringify({state: document.body && document.body.dataset.state, "
                             "messages: [...document.querySelectorAll('.message')].map(m => m.className + ': ' + "
                             "m.textContent), stats: document.getElementById('stats') && "
                             "document.getElementById('stats').textContent})")

    def close(self):
        try:
            self.command("Browser.close", session=False, timeout=5)
        except Exception:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def http_json(url, body=None, key=KEY):
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def server_answer(base, messages, max_tokens):
    reply = http_json(f"{base}/v1/chat/completions",
                      {"messages": messages, "max_tokens": max_tokens, "temperature": 0})
    return reply["choices"][0]["message"]["content"]


def running_requests(base):
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        text = response.read().decode()
    match = re.search(r"^splitflow_num_requests_running (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--splitflow", required=True)
    parser.add_argument("--shared", required=True)
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = parser.parse_args()
    model = os.path.join(args.shared, "models/stories260K-hf")
    template = os.path.join(args.shared, "models/llama3_1-tokenizer/tokenizer_config.json")
    if not args.chromium:
        print("SKIP: chromium is not installed (Debian package `chromium`)")
        return 77
    if not os.path.isdir(model) or not os.path.isfile(template):
        print(f"SKIP: {model} or {template} is missing")
        return 77

    server = subprocess.Popen([args.splitflow, "serve", "--model", model, "--chat-template", template, "--port", "0",
                               "--api-key", KEY, "--no-warmup"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    profile = tempfile.mkdtemp(prefix="sf-chromium-")
    browser = None
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
        base = f"http://127.0.0.1:{port}"
        # Keep reading the server's log so it never blocks on a full pipe.
        threading.Thread(target=lambda: server.stderr.read(), daemon=True).start()
        # The page itself is open (it holds no secret); the API needs the key.
        with urllib.request.urlopen(f"{base}/", timeout=10) as response:
            if "text/html" not in response.headers["Content-Type"]:
                fail(f"GET / answered {response.headers['Content-Type']}")
        try:
            http_json(f"{base}/v1/models", key="wrong")
            fail("/v1/models answered without the key")
        except urllib.error.HTTPError as error:
            if error.code != 401:
                fail(f"/v1/models with a wrong key: {error.code}")

        browser = Chromium(args.chromium, profile)
        # 1. No key: the 401 reaches the page as an error message, and no reply is kept.
        browser.open(f"{base}/?q=Hello&temperature=0&max_tokens=8")
        browser.wait_for("document.body.dataset.state === 'error'")
        error_text = browser.evaluate("document.querySelector('.message.assistant').textContent")
        if "401" not in error_text or "API key" not in error_text:
            fail(f"the page's error without a key: {error_text!r}")
        print(f"without the key the page shows: {error_text!r}")

        # 2. A streamed answer in the DOM, equal to the server's greedy answer.
        question, max_tokens = "Tell me a story about a cat.", 40
        browser.command("Page.navigate", {"url": f"{base}/?key={KEY}&temperature=0&max_tokens={max_tokens}&q="
                                                 + urllib.request.quote(question)})
        browser.wait_for("document.body.dataset.state === 'done'")
        streamed = browser.evaluate("document.querySelector('.message.assistant').textContent")
        expected = server_answer(base, [{"role": "user", "content": question}], max_tokens)
        stats = browser.evaluate("document.getElementById('stats').textContent")
        print(f"page answer: {streamed!r}\nstats line: {stats!r}")
        if not streamed:
            fail("the page shows no streamed answer")
        if streamed != expected:
            fail(f"the page streamed {streamed!r}, the server answers {expected!r}")
        if not re.search(r"\d+ tokens", stats) or "tok/s" not in stats:
            fail(f"the stats line lacks the token count or tok/s: {stats!r}")

        # 3. A second turn typed into the page carries the first exchange.
        follow_up = "And then?"
        browser.evaluate(f"document.getElementById('input').value = {json.dumps(follow_up)}; "
                         "document.getElementById('input').dispatchEvent(new KeyboardEvent('keydown', "
                         "{key: 'Enter', bubbles: true})); true")
        browser.wait_for("document.querySelectorAll('.message.assistant').length === 2 && "
                         "document.body.dataset.state === 'done'")
        second = browser.evaluate("document.querySelectorAll('.message.assistant')[1].textContent")
        expected_second = server_answer(base, [{"role": "user", "content": question},
                                               {"role": "assistant", "content": expected},
                                               {"role": "user", "content": follow_up}], max_tokens)
        print(f"second turn: {second!r}")
        if second != expected_second:
            fail(f"the second turn streamed {second!r}, the server answers {expected_second!r} to the whole "
                 "conversation")

        # 4. Stop: a long sampled reply, stopped from the page as soon as it streams.
        browser.evaluate("document.getElementById('temperature').value = '1'; "
                         "document.getElementById('max_tokens').value = '150'; "
                         "document.getElementById('input').value = 'Go on forever.'; "
                         "document.getElementById('composer').requestSubmit(); true")
        # stories260K may stream all 150 tokens between two polls (CI saw that): wait for the reply to
        # have begun, streaming or already done; a click on a finished reply changes nothing.
        browser.wait_for("document.querySelectorAll('.message.assistant').length === 3 && "
                         "document.querySelectorAll('.message.assistant')[2].textContent.length > 0", timeout=30)
        browser.evaluate("document.getElementById('stop').click(); true")
        finish = browser.wait_for("document.querySelectorAll('.message.assistant')[2].dataset.finish")
        print(f"third reply after Stop: finish {finish!r}")
        # A reply may end by itself (EOS, the context) before the click lands; stopped is the case to see.
        if finish not in ("stopped", "stop", "length"):
            fail(f"the stopped reply ended with {finish!r}")
        deadline = time.time() + 10
        while running_requests(base) not in (0.0, None) and time.time() < deadline:
            time.sleep(0.1)
        if running_requests(base) != 0.0:
            fail(f"{running_requests(base)} requests still running after Stop")
        print(f"PASS: the chat page streams, keeps the conversation and stops (final DOM: {browser.dom_summary()})")
        return 0
    finally:
        if browser:
            browser.close()
        shutil.rmtree(profile, ignore_errors=True)
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    sys.exit(main())
