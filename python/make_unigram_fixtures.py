#!/usr/bin/env python3
"""Small Unigram tokenizer.json files in the shapes of T5, ALBERT and XLM-R, and HF `tokenizers`'
ids for them (the reference tests/tokenizer/unigram_test.cpp compares against).

The vocabularies are SentencePiece Unigram models trained here (`sentencepiece`, 1,000 pieces, on
the head of ../shared/data/wiki.test.raw plus the tokenizer corpus); the pipelines are the ones
transformers' converters write for those models (T5Converter, AlbertConverter,
XLMRobertaConverter in convert_slow_tokenizer.py), built with `tokenizers` directly so no slow
tokenizer class is needed. The precompiled charsmaps are SentencePiece's own: `nmt_nfkc` (the rule
of t5-small, albert-base-v2 and xlm-roberta-base; 240 KB) and, to keep git small, a custom rule
table (normalization_rule_tsv) of a few hundred NFKC and case mappings for the committed ALBERT
shape. tests/python/test_hf_unigram.py imports this module to build every variant (all on
nmt_nfkc) at test time.

    python3 python/make_unigram_fixtures.py --out tests/fixtures/tokenizer/unigram

Needs `sentencepiece` and `tokenizers`; deterministic (SentencePiece trains on one thread with a
fixed seed), so a rerun with the same versions rewrites the same bytes.
"""
import argparse
import json
import os
import pathlib
import sys
import tempfile
import unicodedata

import sentencepiece as spm
import tokenizers
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, processors

REPO = pathlib.Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "fixtures" / "tokenizer" / "corpus.jsonl"
SHARED = REPO.parent / "shared"
VOCAB_SIZE = 1000
SPACE = "\u2581"


def training_lines():
    with open(CORPUS, encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f]
    wiki = (SHARED / "data" / "wiki.test.raw").read_text(encoding="utf-8").split("\n")[:3000]
    lines = [line for line in wiki if line.strip()] + [line for line in corpus if line.strip()] * 3
    return [line.replace("\n", " ").replace("\r", " ") for line in lines]


def custom_rules():
    """A small normalization_rule_tsv: NFKC of fullwidth forms, ligatures, circled and super/
    subscript digits, some compatibility letters, composed sequences (base + combining mark), and
    lowercase for A-Z and a few accented capitals, so the trie has one- and multi-character keys."""
    sources = []
    sources += [chr(cp) for cp in range(0xFF01, 0xFF5F)]      # fullwidth ASCII
    sources += [chr(cp) for cp in range(0xFB00, 0xFB07)]      # ligatures ﬀ ﬁ ﬂ ...
    sources += [chr(cp) for cp in range(0x2460, 0x2474)]      # circled digits
    sources += [chr(cp) for cp in (0x00B2, 0x00B3, 0x00B9, 0x2070, 0x2074, 0x2075, 0x2080, 0x2081, 0x2082)]
    sources += [chr(cp) for cp in (0x3000, 0x00A0, 0x2009, 0x212B, 0x2126, 0x00BD, 0x2153, 0x2026, 0x3231)]
    rules = {s: unicodedata.normalize("NFKC", s) for s in sources}
    for base in "aeiouAEIOUnNcC":
        for mark in ("\u0300", "\u0301", "\u0302", "\u0303", "\u0308", "\u0327"):
            composed = unicodedata.normalize("NFC", base + mark)
            if len(composed) == 1:
                rules[base + mark] = composed
    for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZÀÉÖÜ":
        rules[c] = c.lower()
    rules["\t"] = " "
    rules["\n"] = " "
    return "\n".join(" ".join(f"{ord(c):X}" for c in src) + "\t" + " ".join(f"{ord(c):X}" for c in dst)
                     for src, dst in sorted(rules.items())) + "\n"


def read_varint(data, pos):
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def proto_fields(data):
    """(field number, wire type, value) of one protobuf message; value is bytes for wire type 2."""
    pos = 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            length, pos = read_varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"protobuf wire type {wire}")
        yield field, wire, value


def precompiled_charsmap(model_proto):
    """ModelProto.normalizer_spec (field 3) .precompiled_charsmap (field 2), b"" when absent."""
    for field, wire, value in proto_fields(model_proto):
        if field == 3 and wire == 2:
            for inner, inner_wire, inner_value in proto_fields(value):
                if inner == 2 and inner_wire == 2:
                    return bytes(inner_value)
    return b""


class SpmModel:
    """A trained SentencePiece Unigram model: pieces with scores and types, and its charsmap."""

    def __init__(self, workdir, name, rule, byte_fallback=False):
        text = os.path.join(workdir, "train.txt")
        if not os.path.exists(text):
            with open(text, "w", encoding="utf-8") as f:
                f.write("\n".join(training_lines()) + "\n")
        options = dict(input=text, model_prefix=os.path.join(workdir, name), vocab_size=VOCAB_SIZE,
                       model_type="unigram", character_coverage=0.995, byte_fallback=byte_fallback,
                       num_threads=1, seed_sentencepiece_size=100000, minloglevel=2)
        if rule.endswith(".tsv"):
            options["normalization_rule_tsv"] = rule
        else:
            options["normalization_rule_name"] = rule
        spm.SentencePieceTrainer.train(**options)
        processor = spm.SentencePieceProcessor(model_file=os.path.join(workdir, name + ".model"))
        self.pieces = [(processor.id_to_piece(i), processor.get_score(i)) for i in range(processor.get_piece_size())]
        self.unk_id = processor.unk_id()
        self.charsmap = precompiled_charsmap(processor.serialized_model_proto())


def t5_style(spm_model):
    """t5-small's layout: pieces then 100 <extra_id_N>, unk_id 2, Precompiled, WhitespaceSplit +
    Metaspace, '$A </s>', Metaspace decoder."""
    vocab = list(spm_model.pieces) + [(f"<extra_id_{i}>", 0.0) for i in range(99, -1, -1)]
    tokenizer = tokenizers.Tokenizer(models.Unigram(vocab, unk_id=spm_model.unk_id, byte_fallback=False))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Precompiled(spm_model.charsmap),
                                                 normalizers.Replace(Regex(" {2,}"), " ")])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                       pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always")])
    tokenizer.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always")
    eos = vocab.index(("</s>", 0.0))
    tokenizer.post_processor = processors.TemplateProcessing(single=["$A", "</s>"], pair=["$A", "</s>", "$B", "</s>"],
                                                             special_tokens=[("</s>", eos)])
    tokenizer.add_special_tokens(["<pad>", "</s>", "<unk>"] + [f"<extra_id_{i}>" for i in range(100)])
    return tokenizer


def albert_style(spm_model):
    """albert-base-v2's layout: pieces (scores of pieces that are not number-comma minus 100),
    Replace ``/'' -> ", NFKD, StripAccents, Lowercase, Precompiled, Replace ' {2,}', WhitespaceSplit +
    Metaspace, '[CLS] $A [SEP]'."""
    def number_comma(piece):
        return len(piece) < 2 or piece[-1] != "," or not piece[-2].isdigit()
    vocab = [(p, s if number_comma(p) else s - 100) for p, s in spm_model.pieces]
    vocab = vocab[:4] + [("[CLS]", 0.0), ("[SEP]", 0.0), ("[MASK]", 0.0)] + vocab[4:]
    tokenizer = tokenizers.Tokenizer(models.Unigram(vocab, unk_id=spm_model.unk_id, byte_fallback=False))
    steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"'), normalizers.NFKD(),
             normalizers.StripAccents(), normalizers.Lowercase()]
    if spm_model.charsmap:
        steps.append(normalizers.Precompiled(spm_model.charsmap))
    steps.append(normalizers.Replace(Regex(" {2,}"), " "))
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                       pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always")])
    tokenizer.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always")
    cls, sep = vocab.index(("[CLS]", 0.0)), vocab.index(("[SEP]", 0.0))
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS]:0 $A:0 [SEP]:0",
                                                             pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
                                                             special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tokenizer.add_special_tokens(["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"])
    return tokenizer


def xlmr_style(spm_model):
    """xlm-roberta-base's layout: <s> <pad> </s> <unk> then the pieces after SentencePiece's three
    specials, <mask> last, unk_id 3, Precompiled + Replace ' {2,}', Metaspace (split), '<s> $A </s>'."""
    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + spm_model.pieces[3:] + [("<mask>", 0.0)]
    tokenizer = tokenizers.Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Precompiled(spm_model.charsmap),
                                                 normalizers.Replace(Regex(" {2,}"), " ")])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)
    tokenizer.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                                             special_tokens=[("<s>", 0), ("</s>", 2)])
    tokenizer.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>", tokenizers.AddedToken("<mask>", lstrip=True)])
    return tokenizer


def byte_fallback_style(spm_model):
    """A Unigram with byte_fallback (SentencePiece's <0xNN> pieces) behind NFKC, the Llama-style
    "first" Metaspace without splitting, and the ByteFallback + Fuse + Strip decoder chain."""
    tokenizer = tokenizers.Tokenizer(models.Unigram(spm_model.pieces, unk_id=spm_model.unk_id, byte_fallback=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Strip(left=False, right=True)])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first", split=False)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(content=" ", left=1, right=0)])
    bos = [p for p, _ in spm_model.pieces].index("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tokenizer


def never_style(spm_model):
    """Metaspace with prepend_scheme "never" (pre-tokenizer and decoder) behind NFKD, Strip on both
    sides and a regex Replace of whitespace runs; no post-processor."""
    tokenizer = tokenizers.Tokenizer(models.Unigram(spm_model.pieces, unk_id=spm_model.unk_id, byte_fallback=False))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKD(), normalizers.Strip(),
                                                 normalizers.Replace(Regex(r"\s+"), " ")])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="never", split=True)
    tokenizer.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="never", split=True)
    return tokenizer


# name -> (pipeline, SentencePiece normalization rule, byte_fallback)
COMMITTED = {
    "t5": (t5_style, "nmt_nfkc", False),
    "albert": (albert_style, "custom.tsv", False),
    "byte_fallback": (byte_fallback_style, "identity", True),
}
ALL = dict(COMMITTED, **{
    "albert_nmt_nfkc": (albert_style, "nmt_nfkc", False),
    "xlmr": (xlmr_style, "nmt_nfkc", False),
    "xlmr_nfkc_cf": (xlmr_style, "nmt_nfkc_cf", False),
    "t5_nfkc": (t5_style, "nfkc", False),
    "metaspace_never": (never_style, "identity", False),
})


def build(names, out_dir, workdir):
    """Writes out_dir/<name>/tokenizer.json for each name; returns {name: directory}."""
    rules = os.path.join(workdir, "custom.tsv")
    with open(rules, "w", encoding="utf-8") as f:
        f.write(custom_rules())
    trained = {}
    made = {}
    for name in names:
        pipeline, rule, byte_fallback = ALL[name]
        key = (rule, byte_fallback)
        if key not in trained:
            trained[key] = SpmModel(workdir, f"spm_{len(trained)}", rules if rule == "custom.tsv" else rule, byte_fallback)
        directory = os.path.join(out_dir, name)
        os.makedirs(directory, exist_ok=True)
        pipeline(trained[key]).save(os.path.join(directory, "tokenizer.json"), pretty=False)
        made[name] = directory
    return made


def extra_lines():
    """Lines beyond the shared corpus for Unigram pipelines: unknown characters, compatibility
    forms, grapheme clusters that the charsmap maps by prefix, long unknown runs, `` and ''."""
    return ["``quoted'' and \u201csmart\u201d", "\uff21\u0301 \ufb01\u0301 \u2460\u0301x e\u0301 n\u0303",
            "\U0001F44D\U0001F3FD \U0001F1EB\U0001F1F7 \U0001F468\u200d\U0001F469\u200d\U0001F467",
            "\u1100\u1161\u11a8 \u1100\u1161 \uac00\u11a8", "\u0915\u094d\u0937 \u0924\u094d\u0930",
            "\u2603\u2603\u2603 \u16a0\u16a1\u16a2 \U00010400\U00010401", "\u0301leading mark",
            "x\u200dy a\u00adb", "\u00bd \u2153 \u00b2 \u2075 \u33a1 \u3231 \u2126 \u212b", "ǅ ǈ ǋ ß ẞ İ",
            "1,000,000 and 3,5 and 12,", "tab\there\nnewline\u3000ideographic"]


def reference_lines():
    with open(CORPUS, encoding="utf-8") as f:
        return [json.loads(line) for line in f] + extra_lines()


def write_expected(directory, lines):
    """expected.jsonl: per line {text, ids (no specials), ids_special, decoded (HF's decode of
    ids_special, skipping specials)}, all from HF tokenizers."""
    tokenizer = tokenizers.Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "expected.jsonl"), "w", encoding="utf-8") as f:
        for line in lines:
            ids = tokenizer.encode(line, add_special_tokens=False).ids
            with_special = tokenizer.encode(line, add_special_tokens=True).ids
            record = {"text": line, "ids": ids, "ids_special": with_special,
                      "decoded": tokenizer.decode(with_special, skip_special_tokens=True)}
            f.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(REPO / "tests" / "fixtures" / "tokenizer" / "unigram"))
    args = parser.parse_args()
    lines = reference_lines()
    with tempfile.TemporaryDirectory() as workdir:
        made = build(list(COMMITTED), args.out, workdir)
    for name, directory in made.items():
        write_expected(directory, lines)
        size = sum(p.stat().st_size for p in pathlib.Path(directory).iterdir())
        print(f"{directory}: {size / 1024:.0f} KiB")
    with open(os.path.join(args.out, "versions.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers": tokenizers.__version__, "sentencepiece": spm.__version__}, f)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
