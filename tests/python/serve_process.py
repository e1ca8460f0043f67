"""`splitflow serve --port 0` as a child process, for the Python end-to-end tests.

The port is read from the server's startup line on stderr; the rest of stderr is kept in `log`
(for failure reports). Requests go through urllib so that a test needs no client library.
"""
import json
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request


class ServeProcess:
    def __init__(self, command, start_timeout=120):
        """`command`: the whole `splitflow serve ... --port 0` argument list."""
        self.proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        self.log = []
        deadline = time.time() + start_timeout
        self.port = None
        while self.port is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("splitflow serve exited before listening:\n" + "".join(self.log[-40:]))
            self.log.append(line)
            match = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
            if match:
                self.port = int(match.group(1))
            if time.time() > deadline:
                raise RuntimeError(f"splitflow serve did not start within {start_timeout} s")
        self._reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._reader.start()
        self.url = f"http://127.0.0.1:{self.port}"

    def _drain_stderr(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def get(self, path, timeout=30):
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            return response.status, response.read().decode()

    def post_raw(self, path, body, timeout=30):
        """POSTs `body` (bytes) as JSON; returns (status, text), error statuses included."""
        request = urllib.request.Request(self.url + path, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def post_json(self, path, value, timeout=120):
        return self.post_raw(path, json.dumps(value).encode(), timeout)

    def metric(self, name):
        """A Prometheus sample of /metrics by its full name, or None."""
        _, text = self.get("/metrics")
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        return float(match.group(1)) if match else None

    def stop(self, timeout=60):
        """SIGTERM (the server drains what it accepted), then its exit status; killed past `timeout`.
        `log` is complete afterwards (its reader has reached the end of stderr)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self._reader.join(timeout=10)
        return code
