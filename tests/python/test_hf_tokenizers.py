#!/usr/bin/env python3
"""splitflow's HF tokenizer.json support against HF `tokenizers` (the reference implementation).

Every tokenizer.json under <shared>/models encodes the corpus through one
`splitflow tokenize --input-file` process, with and without --add-special, and must give the ids
`tokenizers` gives. HF's ids are then decoded through `splitflow tokenize --decode` (with and
without --skip-special) and must give HF's text, which covers the round trips HF makes.
Synthetic tokenizer.json variants built with `tokenizers` itself extend the coverage to components
the shared files do not use: WordPiece + BertNormalizer (vocabulary from the bert-bge GGUF),
Metaspace pre-tokenizers and decoder, and NFD / StripAccents / Lowercase / Digits / Punctuation /
WhitespaceSplit on the GPT-2 vocabulary.

Usage: test_hf_tokenizers.py --splitflow BIN --shared DIR --corpus corpus.jsonl
Exit status 77 (skipped) when the `tokenizers` package is missing.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

try:
    import tokenizers
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors
except ImportError:
    print("SKIP: the Python package 'tokenizers' is not installed (pip install tokenizers)")
    sys.exit(77)

SHARED_TOKENIZERS = ["llama2-tokenizer", "gpt2-tokenizer", "llama3_1-tokenizer", "qwen3-tokenizer",
                     "deepseek_v3-tokenizer", "stories260K-hf"]


def run_splitflow(binary, model_dir, input_path, *flags):
    result = subprocess.run([binary, "tokenize", "--model", model_dir, "--input-file", input_path, *flags],
                            capture_output=True, text=True, encoding="utf-8")
    if result.returncode != 0:
        raise RuntimeError(f"splitflow tokenize {model_dir} {' '.join(flags)} failed: {result.stderr}")
    return result.stdout.split("\n")[:-1]


def check_tokenizer(binary, model_dir, lines, corpus_path, scratch):
    """Returns a list of failure descriptions (empty when everything matches)."""
    reference = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    failures = []
    hf_ids_with_special = None
    for add_special in (False, True):
        flags = ["--add-special"] if add_special else []
        ours = run_splitflow(binary, model_dir, corpus_path, *flags)
        expected = [reference.encode(line, add_special_tokens=add_special).ids for line in lines]
        if add_special:
            hf_ids_with_special = expected
        if len(ours) != len(lines):
            failures.append(f"encode add_special={add_special}: {len(ours)} output lines for {len(lines)} inputs")
            continue
        for line, want, got in zip(lines, expected, ours):
            got_ids = [int(x) for x in got.split()]
            if got_ids != want:
                failures.append(f"encode add_special={add_special} {line!r}:\n    hf   {want}\n    ours {got_ids}")

    ids_path = os.path.join(scratch, "ids.jsonl")
    with open(ids_path, "w", encoding="utf-8") as f:
        for ids in hf_ids_with_special:
            f.write(json.dumps(ids) + "\n")
    round_trips = 0
    for skip_special in (False, True):
        flags = ["--decode"] + (["--skip-special"] if skip_special else [])
        ours = run_splitflow(binary, model_dir, ids_path, *flags)
        for line, ids, got in zip(lines, hf_ids_with_special, ours):
            want = reference.decode(ids, skip_special_tokens=skip_special)
            got_text = json.loads(got)
            if got_text != want:
                failures.append(f"decode skip_special={skip_special} {ids}:\n    hf   {want!r}\n    ours {got_text!r}")
            elif skip_special and want == line:
                round_trips += 1
    print(f"  {os.path.basename(model_dir)}: {len(lines)} lines x 2 encodes, 2 decodes; "
          f"{round_trips} decode round trips back to the input; {len(failures)} failures")
    return failures


def bert_from_gguf(shared, out_dir):
    """A BERT WordPiece tokenizer.json whose vocabulary is the bert-bge GGUF's, undoing llama.cpp's
    conversion ("▁word" -> "word", "piece" -> "##piece")."""
    try:
        import gguf
    except ImportError:
        return None
    reader = gguf.GGUFReader(os.path.join(shared, "tokenizer-vectors", "ggml-vocab-bert-bge.gguf"))
    field = reader.fields["tokenizer.ggml.tokens"]
    pieces = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    types = reader.fields["tokenizer.ggml.token_type"]
    token_types = [int(types.parts[i][0]) for i in types.data]
    vocab = {}
    for i, (piece, token_type) in enumerate(zip(pieces, token_types)):
        if token_type == 3 or (piece.startswith("[") and piece.endswith("]")):
            word = piece
        elif piece.startswith("\u2581"):
            word = piece[1:]
        else:
            word = "##" + piece
        vocab.setdefault(word, i)
    tokenizer = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.add_special_tokens(["[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]"])
    path = os.path.join(out_dir, "bert-wordpiece")
    os.makedirs(path)
    tokenizer.save(os.path.join(path, "tokenizer.json"))
    return path


def json_variant(source_json, out_dir, name, edit):
    with open(source_json, encoding="utf-8") as f:
        spec = json.load(f)
    edit(spec)
    path = os.path.join(out_dir, name)
    os.makedirs(path)
    with open(os.path.join(path, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False)
    tokenizers.Tokenizer.from_file(os.path.join(path, "tokenizer.json"))  # HF must accept it too
    return path


def metaspace_first(spec):
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "</s>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                           "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}}


def metaspace_split(spec):
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
    spec["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}


def gpt2_normalized(spec):
    spec["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "NFD"}, {"type": "StripAccents"}, {"type": "Lowercase"}, {"type": "Strip", "strip_left": True,
                                                                           "strip_right": False}]}
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "Punctuation", "behavior": "Isolated"},
        {"type": "WhitespaceSplit"},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": False}]}
    spec["post_processor"] = {"type": "RobertaProcessing", "sep": ["<|endoftext|>", 50256],
                              "cls": ["<|endoftext|>", 50256], "trim_offsets": True, "add_prefix_space": True}


def gpt2_split_behaviors(spec):
    spec["normalizer"] = {"type": "NFC"}
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": False},
        {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[,.!?]"}, "behavior": "MergedWithPrevious", "invert": False},
        {"type": "Split", "pattern": {"Regex": "\\p{Han}+"}, "behavior": "Contiguous", "invert": True},
        {"type": "Whitespace"},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}


def added_token_flags(source_json, out_dir):
    """GPT-2 plus added tokens with every flag HF applies: lstrip, rstrip, single_word, and a
    normalized token matched after a Lowercase normalizer."""
    tokenizer = tokenizers.Tokenizer.from_file(source_json)
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.add_special_tokens([tokenizers.AddedToken("<|im_start|>", lstrip=True, normalized=False),
                                  tokenizers.AddedToken("<|im_end|>", rstrip=True, normalized=False)])
    tokenizer.add_tokens([tokenizers.AddedToken("the", single_word=True, normalized=False),
                          tokenizers.AddedToken("hello", normalized=True)])
    path = os.path.join(out_dir, "gpt2-added-token-flags")
    os.makedirs(path)
    tokenizer.save(os.path.join(path, "tokenizer.json"))
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--splitflow", required=True)
    parser.add_argument("--shared", required=True)
    parser.add_argument("--corpus", required=True)
    args = parser.parse_args()

    with open(args.corpus, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    models_dir = os.path.join(args.shared, "models")
    failures = {}
    with tempfile.TemporaryDirectory() as scratch:
        targets = [os.path.join(models_dir, name) for name in SHARED_TOKENIZERS]
        missing = [t for t in targets if not os.path.exists(os.path.join(t, "tokenizer.json"))]
        if missing:
            print(f"FAIL: missing shared tokenizers: {missing}")
            return 1
        variants = os.path.join(scratch, "variants")
        os.makedirs(variants)
        llama2_json = os.path.join(models_dir, "llama2-tokenizer", "tokenizer.json")
        gpt2_json = os.path.join(models_dir, "gpt2-tokenizer", "tokenizer.json")
        targets.append(json_variant(llama2_json, variants, "llama2-metaspace-first", metaspace_first))
        targets.append(json_variant(llama2_json, variants, "llama2-metaspace-split", metaspace_split))
        targets.append(json_variant(gpt2_json, variants, "gpt2-normalized", gpt2_normalized))
        targets.append(json_variant(gpt2_json, variants, "gpt2-split-behaviors", gpt2_split_behaviors))
        targets.append(added_token_flags(gpt2_json, variants))
        bert = bert_from_gguf(args.shared, variants)
        if bert:
            targets.append(bert)
        else:
            print("  (bert-wordpiece variant skipped: the Python package 'gguf' is not installed)")
        print(f"HF tokenizers {tokenizers.__version__}, corpus {args.corpus} ({len(lines)} lines)")
        for target in targets:
            problems = check_tokenizer(args.splitflow, target, lines, args.corpus, scratch)
            if problems:
                failures[os.path.basename(target)] = problems
    for name, problems in failures.items():
        print(f"FAIL {name}: {len(problems)} mismatches; first ones:")
        for problem in problems[:5]:
            print("  " + problem)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
