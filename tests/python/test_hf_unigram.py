#!/usr/bin/env python3
"""splitflow's Unigram tokenizers and Unicode normalizers against HF `tokenizers`.

1. Every pipeline of python/make_unigram_fixtures.py (T5, ALBERT, XLM-R shapes on SentencePiece's
   nmt_nfkc, nfkc and nmt_nfkc_cf charsmaps, a custom charsmap, byte fallback), built here from
   freshly trained SentencePiece models: the tokenizer corpus plus the Unigram extra lines encode
   (with and without --add-special) to HF's ids, and HF's ids decode (with and without
   --skip-special) to HF's text.
   With the model cache present, also the real XLM-R vocabulary: llama.cpp's ggml-vocab-nomic-bert-moe.gguf
   (<cache>/llama-cpp-vocab, from scripts/fetch_models.py) carries xlm-roberta-base's 250,002
   pieces, scores and precompiled charsmap; they become xlm-roberta-base's tokenizer.json here.
2. Normalizers over every code point: a probe tokenizer whose Unigram vocab is only <unk> and the
   256 <0xNN> pieces (byte_fallback) turns any text into the bytes of its normalized form, so ids
   compare normalized text exactly. NFC, NFD, NFKC, NFKD, BertNormalizer's accent stripping and
   the nmt_nfkc / nmt_nfkc_cf charsmaps see all of U+0000..U+10FFFF (64 code points a line) plus
   lines that test composition (each decomposable character's NFD and NFKD), canonical reordering
   (pairs of combining marks in both orders) and grapheme clusters (marks, ZWJ emoji, regional
   indicators, Hangul jamo, prepend and spacing marks after each mapped character). Pipelines
   with Lowercase skip the code points this Python's unicodedata calls unassigned: HF lowercases
   with Rust's newer Unicode data, splitflow's tables have no case for them.

Usage: test_hf_unigram.py --splitflow BIN
Exit status 77 (skipped) when `tokenizers` or `sentencepiece` is missing.
"""
import argparse
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import unicodedata

try:
    import sentencepiece  # noqa: F401
    import tokenizers
    from tokenizers import models, normalizers
except ImportError as error:
    print(f"SKIP: {error.name} is not installed (pip install tokenizers sentencepiece)")
    sys.exit(77)

REPO = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("make_unigram_fixtures", REPO / "python" / "make_unigram_fixtures.py")
fixtures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fixtures)


def run_splitflow(binary, model_dir, input_path, *flags):
    result = subprocess.run([binary, "tokenize", "--model", model_dir, "--input-file", input_path, *flags],
                            capture_output=True, text=True, encoding="utf-8")
    if result.returncode != 0:
        raise RuntimeError(f"splitflow tokenize {model_dir} {' '.join(flags)} failed: {result.stderr[-2000:]}")
    return result.stdout.split("\n")[:-1]


def write_lines(path, values):
    with open(path, "w", encoding="utf-8") as f:
        for value in values:
            f.write(json.dumps(value, ensure_ascii=True) + "\n")


def compare_encodes(binary, model_dir, lines, scratch, special_flags=((False, []), (True, ["--add-special"]))):
    """Mismatch descriptions of splitflow's encodes against HF's; returns (failures, hf ids with specials)."""
    reference = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    input_path = os.path.join(scratch, "input.jsonl")
    write_lines(input_path, lines)
    failures, with_special = [], None
    for add_special, flags in special_flags:
        ours = run_splitflow(binary, model_dir, input_path, *flags)
        expected = [reference.encode(line, add_special_tokens=add_special).ids for line in lines]
        if add_special:
            with_special = expected
        if len(ours) != len(lines):
            failures.append(f"encode add_special={add_special}: {len(ours)} output lines for {len(lines)} inputs")
            continue
        for line, want, got in zip(lines, expected, ours):
            got_ids = [int(x) for x in got.split()]
            if got_ids != want:
                failures.append(f"encode add_special={add_special} {line!r}:\n    hf   {want}\n    ours {got_ids}")
    return failures, with_special if with_special is not None else expected


def check_pipeline(binary, model_dir, lines, scratch):
    failures, hf_ids = compare_encodes(binary, model_dir, lines, scratch)
    reference = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    ids_path = os.path.join(scratch, "ids.jsonl")
    write_lines(ids_path, hf_ids)
    round_trips = 0
    for skip_special in (False, True):
        ours = run_splitflow(binary, model_dir, ids_path, "--decode", *(["--skip-special"] if skip_special else []))
        for line, ids, got in zip(lines, hf_ids, ours):
            want = reference.decode(ids, skip_special_tokens=skip_special)
            got_text = json.loads(got)
            if got_text != want:
                failures.append(f"decode skip_special={skip_special} {ids}:\n    hf   {want!r}\n    ours {got_text!r}")
            elif skip_special and want == line:
                round_trips += 1
    print(f"  {os.path.basename(model_dir)}: {len(lines)} lines x 2 encodes, 2 decodes; {round_trips} decode round "
          f"trips back to the input; {len(failures)} failures", flush=True)
    return failures


def xlmr_from_gguf(out_dir):
    """xlm-roberta-base's tokenizer.json rebuilt from the GGUF that carries its vocabulary (pieces
    0..250001: <s> <pad> </s> <unk>, the SentencePiece pieces, <mask>; f32 scores as SentencePiece
    stores them), or None without the model cache or the `gguf` package."""
    cache = pathlib.Path(os.environ.get("SPLITFLOW_MODEL_CACHE", REPO / ".cache" / "models"))
    path = cache / "llama-cpp-vocab" / "ggml-vocab-nomic-bert-moe.gguf"
    try:
        import gguf
    except ImportError:
        return None
    if not path.exists():
        return None
    reader = gguf.GGUFReader(str(path))
    tokens, scores = reader.fields["tokenizer.ggml.tokens"], reader.fields["tokenizer.ggml.scores"]
    mask = int(reader.fields["tokenizer.ggml.mask_token_id"].contents())
    pieces = [(bytes(tokens.parts[tokens.data[i]]).decode("utf-8"), float(scores.parts[scores.data[i]][0]))
              for i in range(mask + 1)]
    charsmap = bytes(reader.fields["tokenizer.ggml.precompiled_charsmap"].contents())

    class Model:
        pass
    model = Model()
    model.pieces, model.charsmap = [("", 0.0)] * 3 + pieces[4:mask], charsmap
    tokenizer = fixtures.xlmr_style(model)
    directory = os.path.join(out_dir, "xlm-roberta-base")
    os.makedirs(directory)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    return directory


def probe_tokenizer(directory, normalizer):
    """<unk> + the 256 byte pieces, byte_fallback: the ids spell the normalized text's bytes."""
    vocab = [("<unk>", 0.0)] + [(f"<0x{b:02X}>", -1.0) for b in range(256)]
    tokenizer = tokenizers.Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    tokenizer.normalizer = normalizer
    os.makedirs(directory, exist_ok=True)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    return directory


def normalization_lines(skip_unassigned=False):
    code_points = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    if skip_unassigned:
        code_points = [cp for cp in code_points if unicodedata.category(chr(cp)) != "Cn"]
    lines = ["".join(chr(cp) for cp in code_points[i:i + 64]) for i in range(0, len(code_points), 64)]
    decomposable = [cp for cp in code_points if unicodedata.decomposition(chr(cp))]
    for form in ("NFD", "NFKD"):
        lines += [" ".join(unicodedata.normalize(form, chr(cp)) for cp in decomposable[i:i + 32])
                  for i in range(0, len(decomposable), 32)]
    marks = [cp for cp in code_points if unicodedata.combining(chr(cp))]
    probes = ["\u0301", "\u0316", "\u05b0", "\u0345", "\u093c"]
    for i in range(0, len(marks), 16):
        lines.append(" ".join("a" + chr(m) + p + " a" + p + chr(m) for m in marks[i:i + 16] for p in probes))
    # Grapheme clusters after each character the nmt_nfkc map changes: the cluster-prefix rule.
    mapped = [cp for cp in code_points if unicodedata.normalize("NFKC", chr(cp)) != chr(cp)]
    followers = ["\u0301", "\u200d\u2764", "\U0001F3FD", "\u0903", "\u1161", "\u11a8", "\U0001F1E6\U0001F1E8", "\u0600",
                 "\ufe0f", "\r\n", "x"]
    for i in range(0, len(mapped), 16):
        lines.append(" ".join(chr(cp) + f for cp in mapped[i:i + 16] for f in followers))
    lines += ["\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466", "\U0001F1EB\U0001F1F7\U0001F1E9",
              "\u1100\u1161\u11a8\uac00\u11a8\uac01\u1161", "\u0600\u0661\u0903\u0915\u094d\u0937", "\r\n\r\r\n\n"]
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--splitflow", required=True)
    args = parser.parse_args()

    print(f"HF tokenizers {tokenizers.__version__}, sentencepiece {sentencepiece.__version__}", flush=True)
    failures = {}
    with tempfile.TemporaryDirectory() as scratch:
        work = os.path.join(scratch, "spm")
        os.makedirs(work)
        made = fixtures.build(list(fixtures.ALL), os.path.join(scratch, "unigram"), work)
        lines = fixtures.reference_lines()
        xlmr = xlmr_from_gguf(os.path.join(scratch, "unigram"))
        if xlmr:
            made["xlm-roberta-base"] = xlmr
        else:
            print("  (xlm-roberta-base skipped: no <cache>/llama-cpp-vocab/ggml-vocab-nomic-bert-moe.gguf or no `gguf`)")
        print(f"1. Unigram pipelines on {len(lines)} lines", flush=True)
        for name, directory in made.items():
            problems = check_pipeline(args.splitflow, directory, lines, scratch)
            if problems:
                failures[name] = problems

        charsmaps = {}
        for rule in ("nmt_nfkc", "nmt_nfkc_cf"):
            charsmaps[rule] = fixtures.SpmModel(work, f"probe_{rule}", rule).charsmap
        # name -> (normalizer, lowercases)
        probes = {
            "NFC": (normalizers.NFC(), False), "NFD": (normalizers.NFD(), False), "NFKC": (normalizers.NFKC(), False),
            "NFKD": (normalizers.NFKD(), False),
            "NFD+StripAccents": (normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents()]), False),
            "NFKD+StripAccents+Lowercase": (normalizers.Sequence([normalizers.NFKD(), normalizers.StripAccents(),
                                                                  normalizers.Lowercase()]), True),
            "BertNormalizer": (normalizers.BertNormalizer(lowercase=False, strip_accents=True), False),
            "BertNormalizer lowercase": (normalizers.BertNormalizer(lowercase=True), True),
            "Precompiled nmt_nfkc": (normalizers.Precompiled(charsmaps["nmt_nfkc"]), False),
            "Precompiled nmt_nfkc_cf": (normalizers.Precompiled(charsmaps["nmt_nfkc_cf"]), False),
        }
        all_lines, assigned_lines = normalization_lines(), normalization_lines(skip_unassigned=True)
        print(f"2. normalizers on {len(all_lines)} lines (every code point, composition, reordering, "
              f"grapheme clusters; {len(assigned_lines)} without unassigned code points where they lowercase)",
              flush=True)
        for name, (normalizer, lowercases) in probes.items():
            directory = probe_tokenizer(os.path.join(scratch, "probe", name.replace(" ", "_").replace("+", "_")),
                                        normalizer)
            probe_lines = assigned_lines if lowercases else all_lines
            problems, _ = compare_encodes(args.splitflow, directory, probe_lines, scratch, ((False, []),))
            print(f"  {name}: {len(probe_lines)} lines; {len(problems)} failures", flush=True)
            if problems:
                failures[name] = problems
        if xlmr:  # the real vocabulary and charsmap over every code point: unknown runs, fusing, grapheme rule
            problems, _ = compare_encodes(args.splitflow, xlmr, all_lines, scratch, ((False, []),))
            print(f"  xlm-roberta-base (the whole Unigram pipeline): {len(all_lines)} lines; {len(problems)} failures",
                  flush=True)
            if problems:
                failures["xlm-roberta-base every code point"] = problems
    for name, problems in failures.items():
        print(f"FAIL {name}: {len(problems)} mismatches; first ones:")
        for problem in problems[:5]:
            print("  " + problem[:1500])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
