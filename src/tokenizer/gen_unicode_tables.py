#!/usr/bin/env python3
"""Writes unicode_tables.cpp: general categories, canonical and compatibility decompositions,
compositions, combining classes, lowercase mappings and grapheme cluster break properties for
every code point, from Python's unicodedata plus perl's Unicode::UCD (character ages, grapheme
cluster breaks, Extended_Pictographic; both must be of the same Unicode version). Run from this folder:
    python3 gen_unicode_tables.py > unicode_tables.cpp
The tokenizer needs these for the NFC/NFD/NFKC/NFKD normalizers, BERT normalization, the
Precompiled normalizer's grapheme clusters and llama.cpp's category flags; PCRE2 covers the regex
side with its own tables of the same Unicode version.

HF tokenizers normalizes with Unicode 9.0 data (unicode-normalization-alignments): characters
assigned later neither decompose nor reorder there. kNormalizationNewerThanHf lists the code points
of this version's normalization data (a decomposition or a combining class) that are newer than
9.0, so the HF normalizers can treat them as HF does. Its StripAccents drops General_Category M as
of Unicode 9.0 (the same crate); its BertNormalizer drops Mn and removes Cc/Cf/Co as of Unicode 8.0
(the unicode_categories crate). Those three sets are written as ranges, from this version's
categories and ages plus the few older characters whose category changed since (HISTORIC)."""
import subprocess
import unicodedata as ud

CATEGORIES = ["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe",
              "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co", "Cn"]
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3
MAX_CODEPOINT = 0x110000
HF_NORMALIZATION_VERSION = (9, 0)
# unicode::GraphemeBreak, in order; Extended_Pictographic is folded in (those code points are all GCB=Other).
GRAPHEME_BREAKS = ["Other", "CR", "LF", "Control", "Extend", "ZWJ", "Regional_Indicator", "Prepend", "SpacingMark",
                   "L", "V", "T", "LV", "LVT", "ExtPict"]

# Old characters whose General_Category in Unicode 8.0 / 9.0 (the versions HF's crates have)
# differs from this version's: U+1CF2/U+1CF3 VEDIC SIGN (ROTATED) ARDHAVISARGA were Mc (Lo since
# 10.0); U+111C9 SHARADA SANDHI MARK was Po (Mn now); U+A9BD JAVANESE CONSONANT SIGN KERET was Mc
# (Mn now); U+1885/U+1886 MONGOLIAN LETTER ALI GALI (THREE) BALUDA were Lo until 9.0 made them Mn;
# U+1734 HANUNOO SIGN PAMUDPOD was Mn (Mc since 14.0).
HISTORIC = {0x1CF2: {(8, 0): "Mc", (9, 0): "Mc"}, 0x1CF3: {(8, 0): "Mc", (9, 0): "Mc"},
            0x111C9: {(8, 0): "Po", (9, 0): "Po"}, 0xA9BD: {(8, 0): "Mc", (9, 0): "Mc"},
            0x1885: {(8, 0): "Lo"}, 0x1886: {(8, 0): "Lo"}, 0x1734: {(8, 0): "Mn", (9, 0): "Mn"}}


def category_at(cp, version, ages):
    """General category of `cp` in Unicode `version` (8.0 or 9.0; None when not yet assigned)."""
    if ages[cp] is None or ages[cp] > version:
        return None
    return HISTORIC.get(cp, {}).get(version, ud.category(chr(cp)))


def ranges_of(predicate):
    out, start = [], None
    for cp in range(MAX_CODEPOINT + 1):
        inside = cp < MAX_CODEPOINT and predicate(cp)
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            out.append((start, cp - 1))
            start = None
    return out


PERL_PROPERTIES = r"""
use Unicode::UCD qw(prop_invmap prop_invlist);
print "version ", Unicode::UCD::UnicodeVersion(), "\n";
my ($list, $map) = prop_invmap("Age");
print "age ", join(" ", map { "$$list[$_]:$$map[$_]" } 0 .. $#$list), "\n";
($list, $map) = prop_invmap("Grapheme_Cluster_Break");
print "gcb ", join(" ", map { "$$list[$_]:$$map[$_]" } 0 .. $#$list), "\n";
print "extpict ", join(" ", prop_invlist("Extended_Pictographic")), "\n";
"""


def perl_properties():
    """(ages, grapheme breaks) per code point from perl's Unicode::UCD."""
    out = subprocess.run(["perl", "-e", PERL_PROPERTIES], capture_output=True, text=True, check=True).stdout
    lines = dict(line.split(" ", 1) for line in out.strip().split("\n"))
    if lines["version"] != ud.unidata_version:
        raise SystemExit(f"perl's Unicode {lines['version']} differs from Python's {ud.unidata_version}")

    def expand(pairs, convert):
        values = [None] * MAX_CODEPOINT
        items = [p.rsplit(":", 1) for p in pairs.split()]
        for i, (start, value) in enumerate(items):
            end = int(items[i + 1][0]) if i + 1 < len(items) else MAX_CODEPOINT
            converted = convert(value)
            for cp in range(int(start), min(end, MAX_CODEPOINT)):
                values[cp] = converted
        return values

    ages = expand(lines["age"], lambda v: None if v == "Unassigned" else tuple(int(x) for x in v.split(".")))
    breaks = expand(lines["gcb"], lambda v: "Other" if v == "ExtPict_XX" else v)
    bounds = [int(x) for x in lines["extpict"].split()]
    for i in range(0, len(bounds), 2):
        for cp in range(bounds[i], bounds[i + 1] if i + 1 < len(bounds) else MAX_CODEPOINT):
            if breaks[cp] != "Other":
                raise SystemExit(f"Extended_Pictographic U+{cp:04X} has grapheme break {breaks[cp]}")
            breaks[cp] = "ExtPict"
    return ages, breaks


def rows(items, per_line):
    out = []
    for i in range(0, len(items), per_line):
        out.append("    " + ", ".join(items[i:i + per_line]) + ",")
    return "\n".join(out)


def canonical_decomposition(cp):
    if HANGUL_FIRST <= cp <= HANGUL_LAST:
        return None  # algorithmic, handled in code
    d = ud.decomposition(chr(cp))
    if not d or d.startswith("<"):
        return None
    return [int(x, 16) for x in d.split()]


def full_decomposition(cp):
    parts = canonical_decomposition(cp)
    if parts is None:
        return [cp]
    out = []
    for p in parts:
        out.extend(full_decomposition(p))
    return out


def full_compatibility_decomposition(cp):
    """Canonical and compatibility mappings applied recursively (no reordering; Hangul left whole)."""
    if HANGUL_FIRST <= cp <= HANGUL_LAST:
        return [cp]
    d = ud.decomposition(chr(cp))
    if not d:
        return [cp]
    out = []
    for part in d.split():
        if not part.startswith("<"):
            out.extend(full_compatibility_decomposition(int(part, 16)))
    return out


def main():
    ages, breaks = perl_properties()
    category_ranges = []
    previous = None
    for cp in range(MAX_CODEPOINT):
        category = ud.category(chr(cp))
        if category != previous:
            category_ranges.append((cp, CATEGORIES.index(category)))
            previous = category

    combining = []
    start = None
    for cp in range(MAX_CODEPOINT + 1):
        ccc = ud.combining(chr(cp)) if cp < MAX_CODEPOINT else 0
        if start is not None and ccc != combining_value:
            combining.append((start, cp - 1, combining_value))
            start = None
        if start is None and ccc != 0:
            start, combining_value = cp, ccc

    decompositions, decomposition_data = [], []
    compositions = []
    for cp in range(MAX_CODEPOINT):
        parts = canonical_decomposition(cp)
        if parts is None:
            continue
        full = full_decomposition(cp)
        decompositions.append((cp, len(decomposition_data), len(full)))
        decomposition_data.extend(full)
        # A primary composite is a two-part decomposition that NFC recomposes (this excludes
        # singletons, non-starter decompositions and the composition exclusion list).
        if len(parts) == 2 and ud.normalize("NFC", chr(parts[0]) + chr(parts[1])) == chr(cp):
            compositions.append((parts[0], parts[1], cp))
    compositions.sort()

    compat_decompositions, compat_data = [], []
    for cp in range(MAX_CODEPOINT):
        full = full_compatibility_decomposition(cp)
        if full != full_decomposition(cp) and full != [cp]:
            compat_decompositions.append((cp, len(compat_data), len(full)))
            compat_data.extend(full)

    newer_than_hf = [cp for cp in range(MAX_CODEPOINT)
                     if (ud.decomposition(chr(cp)) or ud.combining(chr(cp))) and ages[cp] is not None
                     and ages[cp] > HF_NORMALIZATION_VERSION]

    hf_marks = ranges_of(lambda cp: (category_at(cp, (9, 0), ages) or "").startswith("M"))
    hf_bert_nonspacing = ranges_of(lambda cp: category_at(cp, (8, 0), ages) == "Mn")
    hf_bert_other = ranges_of(lambda cp: category_at(cp, (8, 0), ages) in ("Cc", "Cf", "Co"))

    break_ranges = []
    previous = None
    for cp in range(MAX_CODEPOINT):
        if breaks[cp] != previous:
            break_ranges.append((cp, GRAPHEME_BREAKS.index(breaks[cp])))
            previous = breaks[cp]

    lowercase, lowercase_data = [], []
    for cp in range(MAX_CODEPOINT):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        lower = chr(cp).lower()
        if lower != chr(cp):
            lowercase.append((cp, len(lowercase_data), len(lower)))
            lowercase_data.extend(ord(c) for c in lower)

    print(f"// Generated by gen_unicode_tables.py from Python's unicodedata (Unicode {ud.unidata_version}).")
    print("// Do not edit; regenerate instead.")
    print('#include "tokenizer/unicode_tables.h"\n')
    print("namespace splitflow::unicode::tables {\n")
    print(f'const char* const kUnicodeVersion = "{ud.unidata_version}";\n')
    print("const CategoryRange kCategoryRanges[] = {")
    print(rows([f"{{0x{a:X}, {b}}}" for a, b in category_ranges], 8))
    print("};")
    print(f"const size_t kCategoryRangeCount = {len(category_ranges)};\n")
    print("const CombiningClassRange kCombiningClassRanges[] = {")
    print(rows([f"{{0x{a:X}, 0x{b:X}, {c}}}" for a, b, c in combining], 6))
    print("};")
    print(f"const size_t kCombiningClassRangeCount = {len(combining)};\n")
    print("const Mapping kDecompositions[] = {")
    print(rows([f"{{0x{a:X}, {b}, {c}}}" for a, b, c in decompositions], 6))
    print("};")
    print(f"const size_t kDecompositionCount = {len(decompositions)};")
    print("const char32_t kDecompositionData[] = {")
    print(rows([f"0x{a:X}" for a in decomposition_data], 10))
    print("};\n")
    print("const Composition kCompositions[] = {")
    print(rows([f"{{0x{a:X}, 0x{b:X}, 0x{c:X}}}" for a, b, c in compositions], 5))
    print("};")
    print(f"const size_t kCompositionCount = {len(compositions)};\n")
    print("const Mapping kCompatibilityDecompositions[] = {")
    print(rows([f"{{0x{a:X}, {b}, {c}}}" for a, b, c in compat_decompositions], 6))
    print("};")
    print(f"const size_t kCompatibilityDecompositionCount = {len(compat_decompositions)};")
    print("const char32_t kCompatibilityDecompositionData[] = {")
    print(rows([f"0x{a:X}" for a in compat_data], 10))
    print("};\n")
    print(f"// Normalization data newer than Unicode {HF_NORMALIZATION_VERSION[0]}.{HF_NORMALIZATION_VERSION[1]}.")
    print("const char32_t kNormalizationNewerThanHf[] = {")
    print(rows([f"0x{a:X}" for a in newer_than_hf], 10))
    print("};")
    print(f"const size_t kNormalizationNewerThanHfCount = {len(newer_than_hf)};\n")
    for name, ranges, what in (("kHfMarkRanges", hf_marks, "General_Category M in Unicode 9.0 (HF's StripAccents)"),
                               ("kHfBertNonspacingMarkRanges", hf_bert_nonspacing, "Mn in Unicode 8.0 (BertNormalizer)"),
                               ("kHfBertOtherRanges", hf_bert_other, "Cc, Cf, Co in Unicode 8.0 (BertNormalizer)")):
        print(f"// {what}.")
        print(f"const CodePointRange {name}[] = {{")
        print(rows([f"{{0x{a:X}, 0x{b:X}}}" for a, b in ranges], 8))
        print("};")
        print(f"const size_t {name[:-6]}RangeCount = {len(ranges)};\n")
    print("const GraphemeBreakRange kGraphemeBreakRanges[] = {")
    print(rows([f"{{0x{a:X}, {b}}}" for a, b in break_ranges], 8))
    print("};")
    print(f"const size_t kGraphemeBreakRangeCount = {len(break_ranges)};\n")
    print("const Mapping kLowercase[] = {")
    print(rows([f"{{0x{a:X}, {b}, {c}}}" for a, b, c in lowercase], 6))
    print("};")
    print(f"const size_t kLowercaseCount = {len(lowercase)};")
    print("const char32_t kLowercaseData[] = {")
    print(rows([f"0x{a:X}" for a in lowercase_data], 10))
    print("};\n")
    print("}  // namespace splitflow::unicode::tables")


if __name__ == "__main__":
    main()
