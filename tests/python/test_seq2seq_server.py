#!/usr/bin/env python3
"""`splitflow serve` on the encoder-decoder fixtures, end to end against HF transformers.

For each tiny random-weight checkpoint of tests/fixtures/encdec (T5 v1.0, T5 v1.1, BART, Marian;
python/make_encdec_fixtures.py) the real binary serves /v1/completions on token ids (the fixtures
have no tokenizer) and several clients send, at once, the fixture's prompts as separate requests,
as one request of two prompts, with n = 2, streamed, and with a shorter max_tokens. Every choice's
tokens must equal transformers' own greedy `generate` on the same checkpoint, computed here. An
oversized prompt must get a 400 naming the encoder's limit while the server keeps serving.

Exit status 77 (skipped) when torch, transformers or safetensors is missing.
"""
import argparse
import concurrent.futures
import json
import sys

from pathlib import Path

from serve_process import ServeProcess

try:
    import torch
    import transformers
    from safetensors.torch import load_file
except ImportError as missing:
    print(f"skipped: {missing}")
    sys.exit(77)

FIXTURES = ("t5_v1_0", "t5_v1_1", "bart", "marian")
STEPS = 10
MAX_BATCH_TOKENS = 48


def start_server(binary, model_dir):
    return ServeProcess(
        [binary, "serve", "--model", str(model_dir), "--port", "0", "--no-warmup", "--threads", "1",
         "--max-seqs", "8", "--max-batch-tokens", str(MAX_BATCH_TOKENS), "--num-blocks", "64", "--block-size", "4"])


def transformers_greedy(model, prompt, steps):
    ids = torch.tensor([prompt])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps,
                         min_new_tokens=steps, do_sample=False, num_beams=1, eos_token_id=None, use_cache=False,
                         no_repeat_ngram_size=0, forced_bos_token_id=None, forced_eos_token_id=None,
                         repetition_penalty=1.0)
    return out[0, 1:].tolist()  # without the decoder's start token


def choice_tokens(status, body, stream):
    """Token ids per choice index of a completion response (whole or SSE)."""
    assert status == 200, body
    tokens = {}
    if not stream:
        for choice in json.loads(body)["choices"]:
            tokens[choice["index"]] = choice["token_ids"]
        return tokens
    events = [e[len("data: "):] for e in body.split("\n\n") if e]
    assert events[-1] == "[DONE]", events[-1]
    for event in events[:-1]:
        for choice in json.loads(event)["choices"]:
            tokens.setdefault(choice["index"], []).extend(choice.get("token_ids", []))
    return tokens


def check_fixture(binary, fixture_dir):
    expected = load_file(str(fixture_dir / "expected.safetensors"))
    prompts = [expected[f"prompt{p}.encoder_tokens"].tolist() for p in range(2)]
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(fixture_dir)).eval()
    torch.manual_seed(0)
    want = [transformers_greedy(model, prompt, STEPS) for prompt in prompts]

    def body(prompt, max_tokens=STEPS, **extra):
        return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "splitflow": {"return_token_ids": True}, **extra}

    # (request body, stream, expected tokens per choice index)
    cases = [
        (body(prompts[0]), False, {0: want[0]}),
        (body(prompts[1]), False, {0: want[1]}),
        (body(prompts), False, {0: want[0], 1: want[1]}),
        (body(prompts[1], n=2), False, {0: want[1], 1: want[1]}),
        (body(prompts[0], stream=True), True, {0: want[0]}),
        (body(prompts[1], max_tokens=4, stream=True), True, {0: want[1][:4]}),
    ]
    server = start_server(binary, fixture_dir)
    failures = []
    try:
        with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
            replies = list(pool.map(lambda case: server.post_json("/v1/completions", case[0]), cases))
        for (request, stream, tokens), (status, text) in zip(cases, replies):
            got = choice_tokens(status, text, stream)
            if got != tokens:
                failures.append(f"{json.dumps(request)}: got {got}, transformers {tokens}")
        too_long = list(range(2, 2 + MAX_BATCH_TOKENS))
        status, text = server.post_json("/v1/completions", body(too_long))
        limit = f"This model's encoder takes at most {MAX_BATCH_TOKENS - 1} tokens, but the prompt has {MAX_BATCH_TOKENS} tokens."
        if status != 400 or limit not in text:
            failures.append(f"an oversized prompt got {status} {text}")
        status, text = server.post_json("/v1/completions", body(prompts[0]))
        if choice_tokens(status, text, False) != {0: want[0]}:
            failures.append(f"after the refusal: {status} {text}")
    finally:
        code = server.stop()
    if code != 0:
        failures.append(f"serve exited with {code}:\n" + "".join(server.log))
    return failures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--splitflow", required=True, help="the splitflow binary")
    parser.add_argument("--fixtures", required=True, help="tests/fixtures/encdec")
    args = parser.parse_args()
    torch.set_num_threads(1)
    failed = False
    for name in FIXTURES:
        failures = check_fixture(args.splitflow, Path(args.fixtures) / name)
        print(f"{name}: {'ok' if not failures else 'FAILED'}")
        for failure in failures:
            print("  " + failure)
        failed |= bool(failures)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
