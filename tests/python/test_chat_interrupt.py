#!/usr/bin/env python3
"""`splitflow chat`'s Ctrl-C: SIGINT during a reply stops that reply and the chat goes on (the
partial reply stays in the history the next turn sends); SIGINT at the prompt ends the chat with
exit status 0. Runs SmolLM2-135M-Instruct (slow enough on a CPU for a reply to be interrupted:
--ignore-eos and 4,000 tokens). Exit status 77 (skipped) without the model cache.
"""
import argparse
import os
import select
import signal
import subprocess
import sys
import time


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


class Chat:
    def __init__(self, command):
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE)
        self.out = b""
        self.err = b""

    def pump(self, seconds):
        end = time.time() + seconds
        while time.time() < end:
            ready, _, _ = select.select([self.process.stdout, self.process.stderr], [], [], 0.05)
            for stream in ready:
                data = os.read(stream.fileno(), 65536)
                if stream is self.process.stdout:
                    self.out += data
                else:
                    self.err += data

    def wait_for(self, predicate, what, timeout=120):
        end = time.time() + timeout
        while time.time() < end:
            self.pump(0.1)
            if predicate():
                return
            if self.process.poll() is not None:
                self.pump(0.2)
                fail(f"chat exited ({self.process.returncode}) while waiting for {what}; stderr: {self.err.decode()}")
        fail(f"timed out waiting for {what}; stderr: {self.err.decode()}")

    def type(self, line):
        self.process.stdin.write(line.encode() + b"\n")
        self.process.stdin.flush()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--splitflow", required=True)
    parser.add_argument("--model-cache", default=os.path.join(os.path.dirname(__file__), "../../.cache/models"))
    args = parser.parse_args()
    model = os.path.join(args.model_cache, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(model):
        print(f"SKIP: {model} is not fetched (scripts/fetch_models.py)")
        return 77

    chat = Chat([args.splitflow, "chat", "-m", model, "-n", "4000", "--ignore-eos", "--temp", "1", "-s", "1",
                 "-c", "8192", "--verbose-prompt"])
    chat.type("Write a very long story.")
    chat.wait_for(lambda: len(chat.out) > 20, "the first reply to stream")
    chat.process.send_signal(signal.SIGINT)
    chat.wait_for(lambda: b"[reply stopped]" in chat.err, "the reply to stop")
    if chat.process.poll() is not None:
        fail("Ctrl-C during a reply ended the chat")
    partial = chat.out.decode().rstrip("\n")
    print(f"stopped after {len(partial)} characters: {partial[:60]!r}...")

    # The chat goes on, and the next turn carries the stopped reply.
    chat.type("Shorter, please.")
    chat.wait_for(lambda: chat.err.count(b"[end of prompt]") == 2, "the second prompt")
    second_prompt = chat.err.decode().split("[prompt, ")[2]
    if partial not in second_prompt or "Write a very long story." not in second_prompt:
        fail(f"the second turn's prompt lacks the first exchange: {second_prompt!r}")
    streamed = len(chat.out)
    chat.wait_for(lambda: len(chat.out) > streamed + 20, "the second reply to stream")
    chat.process.send_signal(signal.SIGINT)
    chat.wait_for(lambda: chat.err.count(b"[reply stopped]") == 2, "the second reply to stop")

    # Ctrl-C at the prompt ends the chat cleanly.
    chat.pump(0.5)
    chat.process.send_signal(signal.SIGINT)
    try:
        status = chat.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        chat.process.kill()
        fail("Ctrl-C at the prompt did not end the chat")
    if status != 0:
        fail(f"Ctrl-C at the prompt: exit status {status}; stderr: {chat.err.decode()}")
    print("PASS: Ctrl-C stops a reply (kept in the history) and the chat goes on; Ctrl-C at the prompt exits 0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
