#!/usr/bin/env python3
"""`splitflow serve` end to end, driven by the official `openai` client.

Starts the server on stories260K-hf (chat through the Llama 3.1 chat template of
../shared/models/llama3_1-tokenizer) and checks completions, chat, streaming, stop strings,
n > 1, logprobs, error statuses, a client leaving mid-stream and the SIGTERM drain.
References, computed here: HF transformers' greedy generation and log_softmax on the same
checkpoint, HF tokenizers' token counts, and the chat prompt as transformers renders the
template with jinja2 (apply_chat_template).

Exit status 77 (skipped) when openai, torch or transformers is missing.
"""
import argparse
import concurrent.futures
import json
import os
import sys
import time
import traceback

from serve_process import ServeProcess


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--splitflow", required=True, help="the splitflow binary")
    parser.add_argument("--shared", required=True, help="the ../shared directory")
    return parser.parse_args()


def start_server(binary, model_dir, chat_template):
    return ServeProcess(
        [binary, "serve", "--model", model_dir, "--port", "0", "--chat-template", chat_template,
         "--threads", "1", "--max-seqs", "8", "--max-batch-tokens", "64", "--num-blocks", "128",
         "--max-queue", "64", "--http-threads", "32"])


def main():
    args = parse_args()
    try:
        import openai
        import torch
        import transformers
    except ImportError as error:
        print(f"skipped: {error.name} is not installed (pip install openai torch transformers)")
        return 77

    model_dir = os.path.join(args.shared, "models", "stories260K-hf")
    template_config = os.path.join(args.shared, "models", "llama3_1-tokenizer", "tokenizer_config.json")
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()  # float32, as stored
    with open(template_config) as f:
        config = json.load(f)

    def hf_greedy(ids, max_new_tokens):
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
        return out[0, len(ids):].tolist()

    def hf_text(new_ids):
        return tokenizer.decode(new_ids, skip_special_tokens=True)

    def hf_logprobs(ids):
        """log_softmax over the vocabulary at each position of ids, (len(ids), vocab)."""
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()
        return torch.log_softmax(logits, dim=-1)

    server = start_server(args.splitflow, model_dir, template_config)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    model_name = "stories260K-hf"
    results = []

    def check(name, function):
        try:
            function()
            results.append((name, None))
            print(f"ok   {name}")
        except Exception:  # noqa: BLE001 - report every failure and go on
            results.append((name, traceback.format_exc()))
            print(f"FAIL {name}\n{traceback.format_exc()}")

    prompt = "Once upon a time, there was a little girl named Lily."
    prompt_ids = tokenizer(prompt).input_ids  # with BOS, as the server encodes a text prompt
    reference_ids = hf_greedy(prompt_ids, 24)
    reference_text = hf_text(reference_ids)

    def models():
        listed = client.models.list()
        assert [m.id for m in listed.data] == [model_name], listed

    def completion_greedy():
        response = client.completions.create(model=model_name, prompt=prompt, max_tokens=24, temperature=0)
        choice = response.choices[0]
        assert choice.text == reference_text, (choice.text, reference_text)
        assert response.usage.prompt_tokens == len(prompt_ids), response.usage
        assert response.usage.completion_tokens == len(reference_ids), response.usage
        expected_reason = "stop" if reference_ids[-1] == tokenizer.eos_token_id else "length"
        assert choice.finish_reason == expected_reason, choice.finish_reason

    def completion_token_ids_prompt():
        response = client.completions.create(model=model_name, prompt=prompt_ids, max_tokens=24, temperature=0)
        assert response.choices[0].text == reference_text

    def completion_stream():
        text, finish, usage, chunks = "", None, None, 0
        stream = client.completions.create(model=model_name, prompt=prompt, max_tokens=24, temperature=0, stream=True,
                                           stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                chunks += 1
                text += choice.text
                finish = choice.finish_reason or finish
        assert text == reference_text, (text, reference_text)
        assert finish in ("stop", "length")
        assert chunks >= 1
        assert usage is not None and usage.completion_tokens == len(reference_ids), usage

    def completion_stop():
        stop = reference_text[len(reference_text) // 2:][:4]
        response = client.completions.create(model=model_name, prompt=prompt, max_tokens=24, temperature=0,
                                             stop=["never-appears-here", stop])
        choice = response.choices[0]
        assert choice.text == reference_text[:reference_text.find(stop)], (choice.text, stop)
        assert choice.finish_reason == "stop"

    def completion_n_and_seed():
        kwargs = dict(model=model_name, prompt=prompt, max_tokens=16, temperature=1.0, n=3, seed=11, logprobs=0)
        first = client.completions.create(**kwargs)
        assert sorted(c.index for c in first.choices) == [0, 1, 2]
        counted = sum(len(c.logprobs.tokens) for c in first.choices)
        assert first.usage.completion_tokens == counted, (first.usage, counted)
        texts = [c.text for c in sorted(first.choices, key=lambda c: c.index)]
        assert len(set(texts)) > 1, texts
        again = client.completions.create(**kwargs)
        assert [c.text for c in sorted(again.choices, key=lambda c: c.index)] == texts

    def completion_logprobs():
        response = client.completions.create(model=model_name, prompt=prompt, max_tokens=8, temperature=0, logprobs=3)
        lp = response.choices[0].logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
        reference = hf_logprobs(prompt_ids + reference_ids[:7])
        for t in range(8):
            row = reference[len(prompt_ids) - 1 + t]
            assert abs(lp.token_logprobs[t] - row[reference_ids[t]].item()) < 1e-3, (t, lp.token_logprobs[t])
            top = sorted(lp.top_logprobs[t].values(), reverse=True)[:3]
            expected_top = torch.topk(row, 3).values.tolist()
            assert all(abs(a - b) < 1e-3 for a, b in zip(top, expected_top)), (t, top, expected_top)

    messages = [{"role": "system", "content": "You tell short stories."},
                {"role": "user", "content": "Tell me about a dog."}]
    # transformers renders the template with jinja2; the template's bos_token is Llama 3.1's own,
    # as in its tokenizer_config.json, which is what the server reads.
    rendered = tokenizer.apply_chat_template(messages, chat_template=config["chat_template"], tokenize=False,
                                             add_generation_prompt=True, bos_token=config["bos_token"])
    chat_ids = tokenizer(rendered, add_special_tokens=False).input_ids
    chat_reference = hf_text(hf_greedy(chat_ids, 12))

    def chat_greedy():
        response = client.chat.completions.create(model=model_name, messages=messages, max_tokens=12, temperature=0)
        assert response.usage.prompt_tokens == len(chat_ids), (response.usage.prompt_tokens, len(chat_ids))
        message = response.choices[0].message
        assert message.role == "assistant"
        assert message.content == chat_reference, (message.content, chat_reference)

    def chat_stream():
        roles, content = [], ""
        stream = client.chat.completions.create(model=model_name, messages=messages, max_tokens=12, temperature=0,
                                                stream=True)
        for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.role:
                    roles.append(choice.delta.role)
                content += choice.delta.content or ""
        assert roles == ["assistant"], roles
        assert content == chat_reference, (content, chat_reference)

    def chat_logprobs_and_n():
        response = client.chat.completions.create(model=model_name, messages=messages, max_tokens=6, n=2, seed=3,
                                                  logprobs=True, top_logprobs=2)
        assert len(response.choices) == 2
        total = 0
        for choice in response.choices:
            content = choice.logprobs.content
            total += len(content)
            assert all(len(entry.top_logprobs) == 2 for entry in content)
            assert all(entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob for entry in content)
        assert response.usage.completion_tokens == total

    def errors():
        try:
            client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
            raise AssertionError("an unknown model was accepted")
        except openai.NotFoundError as error:
            assert error.body["code"] == "model_not_found", error.body
        for kwargs, param in [(dict(temperature=5), "temperature"), (dict(max_tokens=0), "max_tokens"),
                              (dict(n=0), "n"), (dict(top_p=0), "top_p"), (dict(stop=[""]), "stop[0]")]:
            try:
                client.completions.create(model=model_name, prompt="hi", **kwargs)
                raise AssertionError(f"{kwargs} was accepted")
            except openai.BadRequestError as error:
                assert error.body["param"] == param, (kwargs, error.body)
        try:
            client.completions.create(model=model_name, prompt=[5] * 600, max_tokens=2)
            raise AssertionError("a prompt over the context was accepted")
        except openai.BadRequestError as error:
            assert error.body["code"] == "context_length_exceeded", error.body
        try:
            client.chat.completions.create(model=model_name, messages=[], max_tokens=2)
            raise AssertionError("empty messages were accepted")
        except openai.BadRequestError as error:
            assert error.body["param"] == "messages", error.body
        status, body = server.post_raw("/v1/completions", b"{not json")
        assert status == 400 and set(json.loads(body)["error"]) == {"message", "type", "param", "code"}, body
        status, body = server.post_raw("/v1/completions", json.dumps({"prompt": "hi", "temperature": "hot"}).encode())
        assert status == 400 and json.loads(body)["error"]["param"] == "temperature", body

    def concurrent_requests():
        prompts = ["The cat sat on the mat.", "Tom had a red ball.", "One day, a bird", "The sun was hot.",
                   "Max was sad.", "Lily went to the park.", "A big dog ran.", "The boy liked cake."] * 2
        expected = {p: hf_text(hf_greedy(tokenizer(p).input_ids, 20)) for p in set(prompts)}

        def one(p):
            return client.completions.create(model=model_name, prompt=p, max_tokens=20, temperature=0).choices[0].text

        with concurrent.futures.ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            texts = list(pool.map(one, prompts))
        for p, text in zip(prompts, texts):
            assert text == expected[p], (p, text, expected[p])

    def disconnect_mid_stream():
        stream = client.completions.create(model=model_name, prompt=prompt, max_tokens=450, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        for received, _ in enumerate(stream):
            if received >= 1:
                break
        stream.close()
        deadline = time.time() + 20
        while time.time() < deadline:
            if server.metric("splitflow_num_sequences_running") == 0 and \
                    server.metric("splitflow_kv_cache_usage_ratio") == 0:
                break
            time.sleep(0.05)
        assert server.metric("splitflow_num_sequences_running") == 0
        assert server.metric("splitflow_kv_cache_usage_ratio") == 0
        assert server.get("/health")[0] == 200

    def metrics_endpoint():
        _, text = server.get("/metrics")
        for name in ["splitflow_time_to_first_token_seconds_count", "splitflow_inter_token_latency_seconds_count",
                     "splitflow_e2e_request_latency_seconds_count", "splitflow_generation_tokens_total"]:
            value = server.metric(name)
            assert value is not None and value > 0, (name, value)

    try:
        for name, function in [("models", models), ("completion_greedy", completion_greedy),
                               ("completion_token_ids_prompt", completion_token_ids_prompt),
                               ("completion_stream", completion_stream), ("completion_stop", completion_stop),
                               ("completion_n_and_seed", completion_n_and_seed),
                               ("completion_logprobs", completion_logprobs), ("chat_greedy", chat_greedy),
                               ("chat_stream", chat_stream), ("chat_logprobs_and_n", chat_logprobs_and_n),
                               ("errors", errors), ("concurrent_requests", concurrent_requests),
                               ("disconnect_mid_stream", disconnect_mid_stream),
                               ("metrics_endpoint", metrics_endpoint)]:
            check(name, function)
    finally:
        code = server.stop()

    def sigterm_drain():
        assert code == 0, f"exit status {code}"
        log = "".join(server.log)
        assert "draining" in log and "stopped" in log, log

    check("sigterm_drain", sigterm_drain)
    failed = [name for name, error in results if error]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
