#!/usr/bin/env python3
"""Structured outputs and tool calling through `splitflow serve`, driven by the `openai` client.

stories260K-hf writes nonsense, so every valid answer here is the constrained decoder's doing.
Outputs are checked by independent validators: the `jsonschema` package, Python's `re` for regexes
(and for the GBNF grammar's language, written here as a regex), `json` for parsing.
Tool calls: Hermes/Qwen (../shared/models/qwen3-tokenizer's template), Llama 3.2
(tests/fixtures/chat/templates/llama32_style.jinja) and Mistral (mistral_style.jinja).

Exit status 77 (skipped) when openai, jsonschema or the model is missing.
"""
import argparse
import json
import os
import re
import sys
import tempfile

from serve_process import ServeProcess

try:
    import jsonschema
    import openai
except ImportError as error:
    print(f"skipped: {error}")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures", "chat", "templates")


def start_server(binary, model_dir, chat_template, spec):
    """With an OpenAI client on it (`client`). spec: a 2048-token context (stories260K's is 512, less
    than a prompt announcing tools)."""
    server = ServeProcess(
        [binary, "serve", "--model", model_dir, "--port", "0", "--chat-template", chat_template, "--spec", spec,
         "--threads", "1", "--max-seqs", "8", "--max-batch-tokens", "256", "--num-blocks", "512"])
    server.client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    return server


MESSAGES = [{"role": "user", "content": "Tell me about a cat."}]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "alive": {"type": "boolean"},
        "kind": {"enum": ["cat", "dog", 7, None]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "home": {"anyOf": [{"$ref": "#/$defs/place"}, {"type": "null"}]},
        "score": {"type": "number"},
    },
    "required": ["name", "age", "alive", "kind", "tags", "home", "score"],
    "additionalProperties": False,
    "$defs": {"place": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                          "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"], "additionalProperties": False}},
}


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def expect_400(call, *needles):
    try:
        call()
    except openai.BadRequestError as error:
        text = str(error)
        for needle in needles:
            check(needle in text, f"400 without {needle!r}: {text}")
        return
    raise AssertionError(f"expected a 400 naming {needles}")


def schema_format(schema, name="person"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def test_json_schema(client):
    validated = 0
    for seed in range(6):
        response = client.chat.completions.create(
            model="", messages=MESSAGES, response_format=schema_format(PERSON), max_tokens=440,
            temperature=0 if seed == 0 else 1.0, seed=seed,
            logprobs=seed == 1)  # logprobs: the host sampler's path; the others: the device rule's
        choice = response.choices[0]
        check(choice.finish_reason == "stop", f"seed {seed}: finish {choice.finish_reason}: {choice.message.content!r}")
        value = json.loads(choice.message.content)
        jsonschema.validate(value, PERSON)
        validated += 1
    print(f"json_schema: {validated} answers validate, e.g. {choice.message.content}")


def test_json_schema_completions_n_and_stream(client):
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                               "why": {"type": "string", "maxLength": 20}},
              "required": ["answer", "why"]}
    response = client.completions.create(model="", prompt="Once upon a time", max_tokens=200, n=3, temperature=1.0,
                                         seed=5, extra_body={"response_format": schema_format(schema)})
    for choice in response.choices:
        check(choice.finish_reason == "stop", f"completions: {choice.finish_reason}")
        jsonschema.validate(json.loads(choice.text), schema)
    stream = client.chat.completions.create(model="", messages=MESSAGES, response_format=schema_format(schema),
                                            max_tokens=200, temperature=0.8, seed=9, stream=True)
    text, finish = "", None
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    check(finish == "stop", f"stream finish {finish}")
    jsonschema.validate(json.loads(text), schema)
    print(f"completions n=3 and a stream validate: {text}")


def is_json_prefix(text):
    """Whether `text` is the start of some JSON document: json's decoder fails only at the end of
    the input (or on a string still open there)."""
    try:
        json.loads(text)
        return True
    except json.JSONDecodeError as error:
        if error.msg.startswith("Unterminated string"):
            return "\n" not in text[error.pos:] or all(c not in text[error.pos:] for c in "\x00\x01\t")
        rest = text[error.pos:].strip()
        if error.pos >= len(text.rstrip()):
            return True
        if error.msg == "Expecting value":  # cut inside a literal, or after a number's sign
            return any(word.startswith(rest) for word in ("true", "false", "null", "-"))
        # cut inside a number, after its point or exponent sign
        return (error.msg == "Expecting ',' delimiter" and text[error.pos - 1].isdigit()
                and re.fullmatch(r"\.?[0-9]*([eE][-+]?[0-9]*)?", rest) is not None)


def test_json_object(client):
    # stories260K tells stories inside the strings of an unbounded object, so most answers run
    # to max_tokens: those must be a prefix of a JSON object, the finished ones an object.
    stops = 0
    for seed in range(4):
        response = client.chat.completions.create(model="", messages=MESSAGES, response_format={"type": "json_object"},
                                                  max_tokens=120, temperature=1.0, seed=seed)
        choice = response.choices[0]
        text = choice.message.content
        check(text.startswith("{"), f"json_object: {text!r}")
        if choice.finish_reason == "stop":
            check(isinstance(json.loads(text), dict), f"not an object: {text!r}")
            stops += 1
        else:
            check(choice.finish_reason == "length" and is_json_prefix(text), f"not a JSON prefix: {text!r}")
    print(f"json_object: {stops} of 4 finished (objects), the others JSON prefixes")


def test_regex_and_grammar(client):
    pattern = r"[A-Z][a-z]{2,8}-\d{3}( (red|blue))?"
    for seed in range(3):
        response = client.completions.create(model="", prompt="Code:", max_tokens=40, temperature=1.0, seed=seed,
                                             extra_body={"regex": pattern})
        text = response.choices[0].text
        check(re.fullmatch(pattern, text), f"regex: {text!r}")
    grammar = r'''root ::= answer ", because " reason "."
answer ::= "yes" | "no"
reason ::= [a-z]+ (" " [a-z]+){0,3}'''
    language = r"(yes|no), because [a-z]+( [a-z]+){0,3}\."
    for seed in range(3):
        response = client.chat.completions.create(model="", messages=MESSAGES, max_tokens=80, temperature=1.0,
                                                  seed=seed, extra_body={"grammar": grammar})
        text = response.choices[0].message.content
        check(re.fullmatch(language, text), f"grammar: {text!r}")
    print(f"regex and GBNF outputs match, e.g. {text!r}")


def test_rejections(client):
    bad = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}
    expect_400(lambda: client.chat.completions.create(model="", messages=MESSAGES, response_format=schema_format(bad)),
               "minimum", "not supported", "#/properties/n")
    expect_400(lambda: client.chat.completions.create(model="", messages=MESSAGES,
                                                      extra_body={"grammar": "root ::= foo"}), "undefined rule 'foo'")
    expect_400(lambda: client.chat.completions.create(model="", messages=MESSAGES,
                                                      extra_body={"grammar": "root ::= \"a"}), "line 1")
    expect_400(lambda: client.completions.create(model="", prompt="x", extra_body={"regex": r"(a)\1"}), "backreferences")
    expect_400(lambda: client.chat.completions.create(model="", messages=MESSAGES, response_format={"type": "xml"}),
               "'xml'")
    expect_400(lambda: client.chat.completions.create(model="", messages=MESSAGES, response_format={"type": "json_object"},
                                                      extra_body={"regex": "a"}), "cannot be combined")
    print("unsupported schemas, bad grammars and regexes: 400s naming the problem")


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 6}},
                                       "required": ["zone"]}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def check_calls(calls, only=None):
    check(calls, "no tool calls")
    for call in calls:
        check(call.type == "function" and re.fullmatch(r"call_[A-Za-z0-9]{24}|[A-Za-z0-9]{9}", call.id), f"call: {call}")
        check(call.function.name in SCHEMAS, f"unknown function {call.function.name}")
        if only:
            check(call.function.name == only, f"named {only}, got {call.function.name}")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_tools(client, label):
    transcript = []
    for seed in range(3):
        response = client.chat.completions.create(model="", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                                  parallel_tool_calls=False, max_tokens=300, temperature=1.0, seed=seed)
        choice = response.choices[0]
        check(choice.finish_reason == "tool_calls", f"{label} required: finish {choice.finish_reason}: {choice.message}")
        check_calls(choice.message.tool_calls)
        check(len(choice.message.tool_calls) == 1, "parallel_tool_calls false made several calls")
        transcript.append(choice.message.tool_calls[0].model_dump())
    # Parallel calls: the model may go on calling until max_tokens; every call parsed is valid (a
    # reply cut by max_tokens keeps Hermes' closed calls; Llama's and Mistral's are one JSON text).
    response = client.chat.completions.create(model="", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                              max_tokens=200, temperature=1.0, seed=11)
    choice = response.choices[0]
    check(choice.finish_reason in ("tool_calls", "length"), choice.finish_reason)
    if choice.finish_reason == "tool_calls" or choice.message.tool_calls:
        check_calls(choice.message.tool_calls)
    response = client.chat.completions.create(
        model="", messages=MESSAGES, tools=TOOLS, max_tokens=300, temperature=0.7, seed=1, parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    check_calls(response.choices[0].message.tool_calls, only="get_time")
    # Streamed: OpenAI's delta format, assembled as clients do.
    stream = client.chat.completions.create(model="", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                            parallel_tool_calls=False, max_tokens=300, temperature=1.0, seed=3,
                                            stream=True)
    calls, finish = {}, None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = delta.id or entry["id"]
                if delta.function and delta.function.name:
                    entry["name"] += delta.function.name
                if delta.function and delta.function.arguments:
                    entry["arguments"] += delta.function.arguments
    check(finish == "tool_calls" and calls, f"{label} stream: finish {finish}, calls {calls}")
    for entry in calls.values():
        check(re.fullmatch(r"call_[A-Za-z0-9]{24}|[A-Za-z0-9]{9}", entry["id"]) and entry["name"] in SCHEMAS,
              f"stream call {entry}")
        jsonschema.validate(json.loads(entry["arguments"]), SCHEMAS[entry["name"]])
    # The call goes back into the conversation (arguments as a JSON string, OpenAI's way) and the
    # template renders it; tool_choice none: no tools in the prompt, no calls parsed.
    call = response.choices[0].message.tool_calls[0]
    followup = MESSAGES + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                           {"role": "tool", "tool_call_id": call.id, "content": "12:00"}]
    # (The .jinja fixtures come without tokenizer_config.json's special tokens: given here.)
    tokens = {"chat_template_kwargs": {"bos_token": "<s>", "eos_token": "</s>"}}
    with_tools = client.chat.completions.create(model="", messages=followup, tools=TOOLS, max_tokens=5, extra_body=tokens)
    without = client.chat.completions.create(model="", messages=followup, tools=TOOLS, tool_choice="none", max_tokens=5,
                                             extra_body=tokens)
    check(with_tools.usage.prompt_tokens > without.usage.prompt_tokens, "tools did not reach the template")
    check(not without.choices[0].message.tool_calls, "tool_choice none made calls")
    print(f"{label}: required, named, streamed calls validate; e.g. {json.dumps(transcript[0])}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--splitflow", required=True)
    parser.add_argument("--shared", required=True)
    args = parser.parse_args()
    model = os.path.join(args.shared, "models", "stories260K-hf")
    qwen = os.path.join(args.shared, "models", "qwen3-tokenizer", "tokenizer_config.json")
    if not os.path.isdir(model) or not os.path.isfile(qwen):
        print("skipped: no stories260K-hf or qwen3-tokenizer under --shared")
        return 77
    spec = os.path.join(tempfile.mkdtemp(), "context.json")
    with open(spec, "w") as f:
        json.dump({"max_position": 2048}, f)
    server = start_server(args.splitflow, model, qwen, spec)
    try:
        test_json_schema(server.client)
        test_json_schema_completions_n_and_stream(server.client)
        test_json_object(server.client)
        test_regex_and_grammar(server.client)
        test_rejections(server.client)
        test_tools(server.client, "hermes (qwen3 template)")
    except Exception:
        print("".join(server.log[-30:]), file=sys.stderr)
        raise
    finally:
        server.stop()
    for label, template in [("llama 3.2 JSON", "llama32_style.jinja"), ("mistral", "mistral_style.jinja")]:
        server = start_server(args.splitflow, model, os.path.join(FIXTURES, template), spec)
        try:
            test_tools(server.client, label)
        except Exception:
            print("".join(server.log[-30:]), file=sys.stderr)
            raise
        finally:
            server.stop()
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
