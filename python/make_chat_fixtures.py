#!/usr/bin/env python3
"""Expected chat-template renders from jinja2, run exactly as transformers runs it: the oracle for
src/chat (issue 4). Run by hand after changing a case; the outputs are committed.

    python3 python/make_chat_fixtures.py [--shared ../shared] [--out tests/fixtures/chat]
    python3 python/make_chat_fixtures.py --check     # exit 1 if the committed files are stale

Writes into --out:
  engine_cases.json    small templates, one Jinja feature each (whitespace control, operators,
                       filters, tests, methods, scoping, macros, errors), rendered through
                       transformers' compiled environment (ImmutableSandboxedEnvironment with
                       trim_blocks, lstrip_blocks, loopcontrols, raise_exception, strftime_now,
                       its tojson, dict and namespace) by render_jinja_template().
  conversations.json   whole conversations through real templates: those of
                       <shared>/models/*-tokenizer/tokenizer_config.json, rendered with
                       tokenizer.apply_chat_template(tokenize=False), and the templates written for
                       these tests in templates/*.jinja, rendered by render_jinja_template() with
                       the bos/eos tokens listed here.
  named_templates/tokenizer_config.json
                       a config holding a list of named templates (the layout transformers reads
                       when a model has several), for ChatTemplate::from_file.
  gguf/model.gguf      a tensorless GGUF whose metadata holds a template and bos/eos token ids
                       (llama.cpp's keys), for ChatTemplate::find_for_model.

Like apply_chat_template, keys whose value is None are dropped from each message before rendering.
A case that raises records the exception: raise_exception() cases keep its exact message, other
errors a fragment that Python's message contains (checked here) and the C++ message must contain
too; syntax errors record jinja2's line number. Content given as a list of text parts is joined
with "\\n" before rendering when the template never loops over a message's content (vLLM's rule,
which ChatTemplate::render applies); such cases carry "joined_content_parts": true.
"""

import argparse
import json
import sys
from pathlib import Path

import jinja2
import transformers
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template

REPO = Path(__file__).resolve().parent.parent

USERS = [{"name": "bob", "age": 31, "admin": True}, {"name": "Alice", "age": 25, "admin": False},
         {"name": "carol", "age": 40}]
D = {"b": 1, "a": [1, {"c": None}], "é": "ü"}

# (name, template, variables). Variables go through JSON, so key order is kept.
ENGINE_CASES = [
    # ---- whitespace: trim_blocks, lstrip_blocks, -, +, comments, raw, newlines
    ("ws_trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter", {}),
    ("ws_lstrip_blocks", "  {% if true %}\n  x\n  {% endif %}\ndone", {}),
    ("ws_lstrip_tabs_and_comment", "\t\t{% if true %}t{% endif %}\n    {# note #}\nz", {}),
    ("ws_variables_not_lstripped", "  {{ 'v' }}\n  {% if true %}t{% endif %}", {}),
    ("ws_dash_both_sides", "a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}\n  c", {}),
    ("ws_plus_disables", "  {%+ if true +%}\nx{% endif %}\n  {%+ if true %}y{% endif %}", {}),
    ("ws_comments", "a\n  {# c #}\nb {#- d -#} c\n{# e #}f {#+ g +#}\nh", {}),
    ("ws_variable_dash", "a \n {{- 'x' -}} \n b", {}),
    ("ws_tag_mid_line", "text {% if true %}x{% endif %}\nnext  {% if true %}y{% endif %}  \nend", {}),
    ("ws_trailing_newline_dropped", "a\n", {}),
    ("ws_two_trailing_newlines", "a\n\n", {}),
    ("ws_crlf_and_cr", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\rd", {}),
    ("ws_raw", "{% raw %}{{ x }}{% if %}{% endraw %}|{%- raw -%}  {{ y }}  {%- endraw -%}|", {}),
    ("ws_unicode_space_dash", "x\u3000\u00a0{{- 'y' -}}\u2003z", {}),
    ("ws_block_after_variable", "{{ 'a' }}\n  {% if true %}b{% endif %}\n", {}),
    ("ws_indented_structure",
     "{% for m in items %}\n    {% if m %}\n        {{ m }}\n    {% endif %}\n{% endfor %}\nend", {"items": [1, 0, 2]}),
    ("ws_dash_in_expression", "{{ 5 -1 }}|{{ 5-1 -}} |{% set x = 3 -%} {{ x-1 }}", {}),
    # ---- literals and printing
    ("print_numbers",
     "{{ 1 }} {{ 1.0 }} {{ 1.5e-7 }} {{ 1e16 }} {{ 1e15 }} {{ 123456789.123 }} {{ 0.1 + 0.2 }} {{ -0.0 }} "
     "{{ 1_000 }} {{ 0x1f }} {{ 2.5E3 }} {{ 0.0001 }} {{ 0.00001 }}", {}),
    ("print_json_numbers", "{{ f }} {{ i }} {{ big }} {{ neg }}", {"f": 2.5, "i": 7, "big": 12345678901234, "neg": -0.125}),
    ("print_constants", "{{ none }} {{ true }} {{ False }} {{ None }} {{ True }}", {}),
    ("print_string_escapes", "{{ 'a\\nb' }}|{{ \"it's\" }}|{{ 'tab\\there' }}|{{ '\\u00e9\\x41\\101' }}|{{ 'adj' 'acent' }}|"
                             "{{ 'back\\\\slash' }}|{{ 'keep \\d' }}", {}),
    ("print_containers", "{{ [1, 'a', none, true, 1.5, [2]] }} {{ {'a': 1, 'b': [1, 'x']} }} {{ (1,) }} {{ (1, 'b') }} "
                         "{{ () }} {{ d }}", {"d": D}),
    ("print_string_repr", "{{ [\"it's\", 'say \"hi\"', \"both ' \\\"\", 'nl\\n', 'é', '\\x01', '\\\\', '\\u00a0'] }}", {}),
    ("print_tuple_expression", "{{ 1, 2 }}", {}),
    ("print_namespace", "{% set ns = namespace(a=1, b='x') %}{{ ns }}", {}),
    # ---- operators
    ("op_arithmetic", "{{ 10/4 }} {{ 10//4 }} {{ -7//2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2**10 }} {{ 2**-1 }} "
                      "{{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 4/2 }} {{ true + 1 }} {{ 3 - 5 }} {{ 1.5 * 2 }}", {}),
    ("op_precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 1 ~ 2 * 3 }} "
                      "{{ not 1 == 2 }} {{ -3|abs }} {{ 10 - 2 - 3 }} {{ 2 * 3 % 4 }} {{ 'a' ~ (1 + 2) }}", {}),
    ("op_concat", "{{ 1 ~ 'a' ~ none ~ nope ~ [1] }}", {}),
    ("op_sequences", "{{ 'ab' * 3 }} {{ 3 * 'x' }} {{ [1] * 2 }} {{ [1] + [2] }} {{ 'a' + 'b' }} {{ (1,) + (2,) }} "
                     "{{ 'x' * 0 }}|{{ 'x' * -1 }}|", {}),
    ("op_compare", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ 'B' < 'a' }} {{ [1, 2] < [1, 3] }} "
                   "{{ 1 == 1.0 }} {{ 1 == true }} {{ 'a' != 'b' }} {{ none == none }} {{ x == y }} {{ x != 1 }} "
                   "{{ [1, {'a': 2}] == [1, {'a': 2}] }} {{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }} {{ 2 >= 2.0 }}", {}),
    ("op_in", "{{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'cat' }} "
              "{{ 1 in nope }} {{ 'b' in d }} {{ 1.0 in [1] }} {{ '' in 'x' }}", {"d": D}),
    ("op_logic_values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} [{{ '' and 'b' }}] {{ none or [] }} {{ not 0 }} "
                        "{{ not [] }} {{ 1 and 0 or 5 }} {{ nope or 'u' }}", {}),
    ("op_conditional", "{{ 'y' if true else 'n' }} [{{ 'y' if false }}] {{ 'a' if 0 else 'b' if 1 else 'c' }} "
                       "{{ ('t' if x is defined else 'f') ~ '!' }}", {}),
    ("op_percent_format", "{{ '%s-%d-%.2f-%5s|%-4s|%x' % ('a', 3, 2.345, 'r', 'l', 255) }} {{ '%s' % 'x' }} "
                          "{{ '%(a)s=%(b)r' % {'a': 1, 'b': 'q'} }} {{ '%05d|%+d|%e' % (42, 5, 1234.5) }} "
                          "{{ '%%' % () }} {{ '%s' % [1, 2] }}", {}),
    ("op_unary", "{{ -x }} {{ +x }} {{ -(-2.5) }} {{ - - 3 }}", {"x": 4}),
    # ---- subscripts
    ("subscript_slices", "{{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ 'hello'[-2:] }} {{ [1, 2, 3, 4][::2] }} "
                         "{{ [1, 2, 3][5:] }} {{ 'héllo'[1] }} {{ 'héllo'[:2] }} {{ [1, 2, 3][-1] }} [{{ 'abc'[10] }}] "
                         "{{ [1, 2, 3][1:-1] }} {{ 'abcdef'[4:1:-1] }} {{ [1, 2, 3][-10:2] }} {{ (1, 2, 3)[1:] }} "
                         "{{ 'abc'[:] }} {{ [1, 2, 3, 4, 5][-1:0:-2] }}", {}),
    ("subscript_attr_item", "{{ d.b }} {{ d['b'] }} {{ d.items()|list }} {{ d.get('zz', 'dflt') }} {{ d.get('b') }} "
                            "{{ d.get('zz') }} {{ d.keys()|list }} {{ d.values()|list|length }} [{{ d['missing'] }}] "
                            "{{ d.missing is defined }} {{ l.0 }} {{ l[1] }} {{ l[-1] }} [{{ l[5] }}] "
                            "{{ d.a[1].c is none }} {{ d['é'] }}", {"d": D, "l": [10, 20]}),
    ("subscript_method_shadowing", "{{ d['items'] }} {{ d.items()|list|length }} {{ d.get is defined }}", {"d": {"items": "x", "a": 1}}),
    ("subscript_none_attr", "{{ n.x is defined }} [{{ n.x }}] {{ n['x'] is defined }}", {"n": None}),
    # ---- undefined
    ("undefined_behaviour", "[{{ nope }}] {{ nope is defined }} {{ nope|default('d') }} {{ nope|length }} "
                            "{% for x in nope %}x{% else %}empty{% endfor %} {{ nope == nope }} {{ nope == none }} "
                            "{{ 'yes' if nope else 'no' }} [{{ nope|string }}] [{{ nope ~ 'a' }}] {{ nope|list }} "
                            "{{ nope is undefined }} [{{ nope|trim }}] {{ nope|items|list }} {{ nope is iterable }}", {}),
    # ---- statements and scoping
    ("scope_for_does_not_leak", "{% set x = 'outer' %}{% for i in [1, 2] %}{% set x = i %}{{ x }}{% endfor %}{{ x }}"
                                "{% if true %}{% set x = 'if' %}{% endif %}{{ x }}", {}),
    ("scope_per_iteration", "{% for i in [1, 2] %}{% if i == 1 %}{% set y = 'a' %}{% endif %}[{{ y }}]{% endfor %}", {}),
    ("scope_read_before_set", "{% set x = 'o' %}{% for i in [1, 2] %}[{{ x }}]{% set x = i %}[{{ x }}]{% endfor %}{{ x }}", {}),
    ("scope_shadow_context", "{% set messages = messages[1:] %}{{ messages|length }}{% for m in messages %}{{ m.role }}"
                             "{% endfor %}", {"messages": [{"role": "a"}, {"role": "b"}, {"role": "c"}]}),
    ("namespace_mutation", "{% set ns = namespace(a=1, b='x') %}{% set ns.a = ns.a + 1 %}{% for i in range(3) %}"
                           "{% set ns.b = ns.b ~ i %}{% endfor %}{{ ns.a }} {{ ns.b }} {{ ns.c is defined }} {{ ns }}", {}),
    ("namespace_from_dict", "{% set ns = namespace({'k': 1}, extra=2) %}{{ ns.k }}{{ ns.extra }}{% set ns2 = namespace() %}"
                            "{% set ns2.new = 'n' %}{{ ns2.new }}{{ ns['k'] }}", {}),
    ("loop_variables", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
                       "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}"
                       "{{ loop.cycle('o', 'e') }}{{ loop.depth }};{% endfor %}", {}),
    ("loop_filter", "{% for x in range(10) if x is odd %}{{ loop.index }}:{{ x }}{{ ',' if not loop.last }}{% endfor %}", {}),
    ("loop_else", "{% for x in [] %}x{% else %}none{% endfor %}{% for x in [1] if x > 5 %}x{% else %}filtered{% endfor %}", {}),
    ("loop_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}"
                    "{% endfor %}{% for (a, b) in [(1, 2)] %}{{ a }}{{ b }}{% endfor %}{% for a, b in ['xy'] %}{{ b }}{% endfor %}",
     {"d": D}),
    ("loop_over_dict_and_string", "{% for k in d %}{{ k }}{% endfor %}|{% for c in 'hé' %}[{{ c }}]{% endfor %}", {"d": D}),
    ("loop_nested", "{% for i in [1, 2] %}{% for j in [3, 4] %}{{ loop.index }}{{ i }}{{ j }} {% endfor %}"
                    "{{ loop.index }}|{% endfor %}", {}),
    ("loop_break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}"
                            "{% endif %}{{ i }}{% endfor %}|{% for i in [1, 2] %}{% for j in [1, 2] %}{% break %}{% endfor %}"
                            "{{ i }}{% endfor %}", {}),
    ("set_tuple_and_block", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}{% set x %}  hello {{ 1 + 1 }}  "
                            "{% endset %}[{{ x }}]{% set y | upper | trim %} abc {% endset %}[{{ y }}]", {}),
    ("filter_block_and_with", "{% filter upper %}hello {{ 'x' }}{% endfilter %}|{% with a = 1, b = 2 %}{{ a + b }}"
                              "{% endwith %}[{{ a }}]", {}),
    ("macro_arguments", "{% macro m(a, b='B', c=a ~ '!') %}{{ a }}{{ b }}{{ c }}{{ varargs }}{{ kwargs }}{% endmacro %}"
                        "{{ m(1) }}|{{ m(1, 2) }}|{{ m(1, c=3) }}|{{ m(1, 2, 3, 4, z=5) }}|{{ m(b=0, a='A') }}", {}),
    ("macro_missing_argument", "{% macro m(a) %}[{{ a }}]{{ a is defined }}{% endmacro %}{{ m() }}", {}),
    ("macro_recursion", "{% macro f(n) %}{% if n <= 1 %}1{% else %}{{ n * (f(n - 1) | int) }}{% endif %}{% endmacro %}"
                        "{{ f(10) }}", {}),
    ("macro_sees_outer_at_call_time", "{% macro m() %}{{ y }}{% endmacro %}{% set y = 1 %}{{ m() }}{% set y = 2 %}{{ m() }}", {}),
    ("macro_call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}"
                         "inner {{ 1 }}{% endcall %}|{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}"
                         "{% endmacro %}{% call(x) each([1, 2]) %}<{{ x }}>{% endcall %}", {}),
    ("macro_output_is_string", "{% macro m() %}12{% endmacro %}{{ m() ~ 3 }} {{ m()|int + 1 }} {{ m() is string }}", {}),
    ("generation_block", "a{% generation %}b{% set z = 1 %}{% endgeneration %}c[{{ z }}]", {}),
    # ---- filters
    ("filter_strings", "{{ '  hi  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'Hello World'|upper }}|{{ 'Hello'|lower }}|"
                       "{{ 'hello world-foo (bar) [baz] {qux} <q>'|title }}|{{ 'hELLO wORLD'|capitalize }}|"
                       "{{ 'ÉCOLE ñandú'|lower }}|{{ 'ñandú αβγ'|upper }}|{{ none|upper }}|{{ 3|string ~ 'x' }}", {}),
    ("filter_length", "{{ 'abc'|length }} {{ [1, 2]|count }} {{ {'a': 1}|length }} {{ 'héllo'|length }} {{ ''|length }}", {}),
    ("filter_tojson", "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ [1, 'é', none, true, 1.5, 'q\"', 'nl\\n', {}, []]|tojson }}|"
                      "{{ 'x'|tojson }}|{{ d|tojson(sort_keys=true) }}|{{ d|tojson(separators=(',', ':')) }}|"
                      "{{ ['é', '😀']|tojson(ensure_ascii=true) }}|{{ d|tojson(indent='\\t') }}|{{ d|tojson(indent=0) }}|"
                      "{{ {1: 'int', none: 'n', true: 't', 2.5: 'f'}|tojson }}|{{ (1, 2)|tojson }}", {"d": D}),
    ("filter_tojson_numbers_and_controls", "{{ [1.0, 1e-7, 1e16, 123.456, 0.1, -0.0, 10, f]|tojson }} "
                                           "{{ '\\x01\\x1f\\x7f\\u2028\\b\\f\\r\\t\\\\/'|tojson }}", {"f": 3.25}),
    ("filter_string_int_float", "{{ 1|string }}{{ none|string }}{{ [1]|string }}{{ true|string }} {{ '42'|int }} "
                                "{{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ -3.9|int }} "
                                "{{ '1A'|int(base=16) }} {{ ' 12 '|int }} {{ '1_000'|int }} {{ true|int }} {{ none|int }} "
                                "{{ '1.5'|float }} {{ 'x'|float }} {{ 2|float }} {{ '1e3'|float }} {{ 'x'|float(1.5) }}", {}),
    ("filter_join", "{{ [1, 2, 3]|join(', ') }} {{ 'abc'|join('-') }} {{ users|join(', ', attribute='name') }} "
                    "{{ [1, none]|join }}", {"users": USERS}),
    ("filter_default", "{{ none|default('d') }} [{{ ''|default('d') }}] {{ ''|default('d', true) }} {{ nope|d('dd') }} "
                       "{{ 0|default(5) }} {{ false|default('x', boolean=true) }} [{{ nope|default }}]", {}),
    ("filter_first_last_items_list", "{{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ 'abc'|first }} [{{ []|first }}] "
                                     "{{ d|items|list }} {{ 'ab'|list }} {{ d|list }} {{ d|first }}", {"d": D}),
    ("filter_replace", "{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'ab'|replace('', '-') }} "
                       "{{ 'héé'|replace('é', 'e') }}", {}),
    ("filter_map", "{{ users|map(attribute='name')|list }} {{ ['a', 'b']|map('upper')|list }} "
                   "{{ users|map(attribute='age', default=0)|list }} {{ [' a ', 'b ']|map('trim')|join }} "
                   "{{ [{'f': {'g': 1}}]|map(attribute='f.g')|list }} {{ [[1, 2]]|map(attribute='1')|list }} "
                   "{{ ['1', '2']|map('int')|sum }}", {"users": USERS}),
    ("filter_select_reject", "{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('odd')|list }} "
                             "{{ [0, 1, '', none, 'x']|select|list }} {{ users|selectattr('admin')|map(attribute='name')|list }} "
                             "{{ users|rejectattr('admin')|list|length }} {{ users|selectattr('name', 'equalto', 'bob')|list }} "
                             "{{ users|selectattr('admin', 'defined')|list|length }} {{ [1, 5, 10]|select('gt', 3)|list }} "
                             "{{ ['a', 'b']|select('in', ['b', 'c'])|list }} {{ users|selectattr('age', '>', 30)|map(attribute='name')|join }}",
     {"users": USERS}),
    ("filter_unique_dictsort_sort", "{{ [1, 2, 1, 3, 2]|unique|list }} {{ ['a', 'A', 'b']|unique|list }} "
                                    "{{ ['a', 'A']|unique(case_sensitive=true)|list }} {{ {'b': 1, 'A': 2, 'c': 0}|dictsort }} "
                                    "{{ {'b': 1, 'a': 2}|dictsort(by='value') }} {{ {'b': 1, 'a': 2}|dictsort(reverse=true) }} "
                                    "{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }} "
                                    "{{ users|sort(attribute='name', reverse=true)|map(attribute='name')|join(',') }} "
                                    "{{ users|unique(attribute='admin')|map(attribute='name')|join(',') }}", {"users": USERS}),
    ("filter_indent", "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|"
                      "{{ 'x\\n'|indent('>>') }}|{{ 'x\\r\\ny'|indent(1) }}|{{ ''|indent(first=true) }}", {}),
    ("filter_round_abs_sum_min_max", "{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 2.1|round(0, 'ceil') }} "
                                     "{{ 2.9|round(method='floor') }} {{ 5|round }} {{ 1.23456|round(3) }} {{ -3|abs }} "
                                     "{{ -2.5|abs }} {{ [1, 2, 3]|sum }} {{ [{'a': 1}, {'a': 2}]|sum(attribute='a') }} "
                                     "{{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ ['b', 'A']|min }} {{ [1.5, 2]|sum(start=10) }} "
                                     "{{ users|max(attribute='age')|attr('get') is defined }}", {"users": USERS}),
    ("filter_misc", "{{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3]|batch(2, 'x')|list }} [{{ 'ab'|center(7) }}] "
                    "[{{ 'abc'|center(6) }}] {{ 'one two  three_x 4'|wordcount }} {{ '<a href=\"x\">&\\'</a>'|e }} "
                    "{{ 1|safe }} {{ 'abc'|reverse }} {{ [1, 2]|reverse|list }} {{ '%s and %s'|format('a', 'b') }} "
                    "{{ '%(x)s'|format(x=1) }}{% set ns = namespace(v=7) %} {{ ns|attr('v') }} [{{ d|attr('b') }}]",
     {"d": D}),
    # ---- tests
    ("tests_types", "{{ 1 is odd }}{{ 2 is even }}{{ 6 is divisibleby 3 }}{{ 6 is divisibleby(4) }}{{ none is none }}"
                    "{{ 1 is number }}{{ 1.5 is number }}{{ true is number }}{{ 'a' is number }}{{ 1 is integer }}"
                    "{{ true is integer }}{{ 1.0 is float }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is mapping }}"
                    "{{ [] is iterable }}{{ 'a' is iterable }}{{ 1 is iterable }}{{ [] is sequence }}{{ {} is sequence }}"
                    "{{ 1 is sequence }}{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 0 is false }}"
                    "{{ true is boolean }}{{ 'a' is lower }}{{ 'A' is upper }}{{ 'aB' is lower }}{{ ns is mapping }}"
                    "{{ none is string }}{{ nope is none }}{% set ns = namespace(v=7) %}{{ ns is mapping }}", {}),
    ("tests_comparisons", "{{ 1 is eq 1 }}{{ 1 is equalto 2 }}{{ 1 is ne 2 }}{{ 2 is gt 1 }}{{ 2 is ge 2 }}{{ 1 is lt 2 }}"
                          "{{ 1 is le 0 }}{{ 2 is in [1, 2] }}{{ 'a' is in 'abc' }}{{ 2 is greaterthan 1 }}"
                          "{{ 1 is lessthan 2 }}{{ none is sameas none }}{{ range is callable }}{{ 'upper' is filter }}"
                          "{{ 'odd' is test }}{{ 'nope' is filter }}{{ nope is undefined }}{{ 1 is not none }}"
                          "{{ x is defined and x.y is defined }}{{ [1, 2]|select('==', 2)|list }}", {}),
    # ---- methods
    ("methods_str", "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(none, 1) }} {{ 'a,b,c'.rsplit(',', 1) }} "
                    "{{ ' a b  c '.rsplit(none, 1) }} {{ ' a b c '.split(none, 1) }} {{ 'a<>b<>c'.split('<>', maxsplit=1) }} [{{ '  x  '.strip() }}] "
                    "[{{ 'xxaxx'.strip('x') }}] [{{ '  x '.lstrip() }}] [{{ ' x  '.rstrip() }}] [{{ '\\n\\nx\\n'.strip('\\n') }}] "
                    "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'abc'.startswith('abcd') }} "
                    "{{ 'Hello'.upper() }}{{ 'Hello'.lower() }} {{ \"they're bill's 2nd\".title() }} {{ 'hELLO'.capitalize() }} "
                    "{{ 'aXa'.replace('a', 'b') }} {{ 'aaa'.replace('a', 'b', 1) }} {{ 'abcabc'.find('c') }} {{ 'abc'.find('z') }} "
                    "{{ 'abcabc'.rfind('b') }} {{ 'aaa'.count('a') }} {{ 'héllo'.find('l') }} {{ '-'.join(['a', 'b']) }} "
                    "{{ 'a\\nb\\r\\nc\\n'.splitlines() }} {{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ ' '.isspace() }}"
                    "{{ ''.isdigit() }}{{ 'a1'.isalnum() }} {{ 'pre_x'.removeprefix('pre_') }} "
                    "{{ 'x.txt'.removesuffix('.txt') }} {{ '{} is {name}'.format(1, name='n') }} {{ '{1}{0}'.format('a', 'b') }} {{ '5'.zfill(3) }} "
                    "{{ '-5'.zfill(4) }} {{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} "
                    "[{{ '\u3000 x \u00a0'.strip() }}] {{ 'ab'.ljust(4) }}| {{ 'ab'.rjust(4) }} {{ 'aB'.swapcase() }}", {}),
    ("methods_list", "{{ [1, 2, 1].count(1) }} {{ ['a', 'b'].index('b') }} {{ (1, 2).index(2) }}", {}),
    # ---- globals
    ("globals", "{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ range(0)|list }} "
                "{{ range(3, 1)|list }} {{ dict(a=1, b=2) }} {{ dict([('x', 1)]) }} {{ dict({'k': 'v'}, z=0) }} "
                "{{ strftime_now('%Y')|int > 2000 }} {{ strftime_now('%d %b %Y')|length }}", {}),
    ("messages_aliases_and_none_keys", "{{ messages|tojson }}",
     {"messages": [{"role": "assistant", "content": "x", "reasoning": "r", "name": None},
                   {"role": "assistant", "thinking": "t", "content": None, "reasoning_content": None},
                   {"thinking": None, "role": "user", "content": "u"}]}),
    ("context_variables", "{{ messages|length }} {{ add_generation_prompt }} {{ tools }} {{ documents }} "
                          "{{ bos_token is defined }} {{ custom }}", {"custom": {"k": [1]}}),
]

# (name, template, variables, error fragment or None for raise_exception's exact message)
ENGINE_ERRORS = [
    ("error_raise_exception", "{{ raise_exception('Boom: ' ~ 42) }}", {}, None),
    ("error_raise_in_macro", "{% macro m() %}{{ raise_exception('from macro') }}{% endmacro %}{% if true %}{{ m() }}{% endif %}",
     {}, None),
    ("error_undefined_attribute", "{{ nope.x }}", {}, "'nope' is undefined"),
    ("error_missing_key_chain", "{{ d.missing.x }}", {"d": D}, "has no attribute 'missing'"),
    ("error_str_plus_int", "{{ 'a' + 1 }}", {}, "can only concatenate str"),
    ("error_concat_binds_tighter_than_plus", "{{ 'a' ~ 1 + 2 }}", {}, "can only concatenate str"),
    ("error_int_plus_str", "{{ 1 + 'a' }}", {}, "unsupported operand type(s) for +"),
    ("error_undefined_arithmetic", "{{ nope + 1 }}", {}, "'nope' is undefined"),
    ("error_undefined_compare", "{{ 1 < nope }}", {}, "'nope' is undefined"),
    ("error_division_by_zero", "{{ 1 / 0 }}", {}, "division by zero"),
    ("error_modulo_by_zero", "{{ 1 % 0 }}", {}, "modulo by zero"),
    ("error_unorderable", "{{ 1 < 'a' }}", {}, "not supported between instances of"),
    ("error_not_iterable", "{% for x in 1 %}{% endfor %}", {}, "object is not iterable"),
    ("error_not_callable", "{{ x() }}", {"x": 1}, "object is not callable"),
    ("error_set_attribute_on_dict", "{% set d.x = 1 %}", {"d": D}, "cannot assign attribute on non-namespace object"),
    ("error_namespace_underscore", "{% set ns = namespace() %}{% set ns._x = 1 %}", {}, "underscore-prefixed"),
    ("error_list_append_unsafe", "{% set l = [1] %}{{ l.append(2) }}", {}, "is unsafe"),
    ("error_range_too_big", "{{ range(1000000)|length }}", {}, "Range too big"),
    ("error_tojson_undefined", "{{ nope|tojson }}", {}, "is not JSON serializable"),
    ("error_length_of_int", "{{ 1|length }}", {}, "has no len()"),
    ("error_unpack", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}, "too many values to unpack"),
    ("error_macro_extra_argument", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", {}, "takes not more than 1 argument"),
    ("error_macro_unknown_keyword", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, b=2) }}", {}, "takes no keyword argument 'b'"),
    ("error_items_of_list", "{{ [1]|items|list }}", {}, "Can only get item pairs from a mapping"),
    ("error_split_empty_separator", "{{ 'a'.split('') }}", {}, "empty separator"),
    ("error_in_string_needs_string", "{{ 1 in 'abc' }}", {}, "requires string as left operand"),
]

# (name, template): jinja2 refuses these at compile time; the line it reports is recorded.
SYNTAX_ERRORS = [
    ("syntax_empty_if", "{% if %}{% endif %}"),
    ("syntax_line_three", "a\nb\n{% for x in %}{% endfor %}"),
    ("syntax_dangling_operator", "{{ 1 + }}"),
    ("syntax_unknown_end_tag", "text\n{% endfor %}"),
    ("syntax_unclosed_for", "{% for x in y %}\nbody\n"),
    ("syntax_unclosed_if_after_lines", "line1\nline2\n{% if x %}\n{% for y in z %}{% endfor %}"),
    ("syntax_unterminated_string", "{{ 'abc }}"),
    ("syntax_bracket_mismatch", "{{ (1, 2 }}"),
    ("syntax_default_order", "{% macro m(a=1, b) %}{% endmacro %}"),
    ("syntax_unknown_filter", "ok\n{{ x | nope }}"),
    ("syntax_unknown_test", "{{ x is nosuchtest }}"),
    ("syntax_unknown_tag", "{% frobnicate %}"),
    ("syntax_unclosed_variable", "{{ x "),
    ("syntax_unclosed_comment", "a {# b"),
    ("syntax_chained_is", "{{ x is defined is defined }}"),
]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "days": {"type": "array", "items": {"type": "integer"}},
                "extra": {"type": "object", "additionalProperties": {"type": ["number", "null"]}},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {"name": "search", "description": "Web search.",
                 "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}},
}


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def system(text):
    return {"role": "system", "content": text}


def tool_call_message(calls, content=None):
    return {"role": "assistant", "content": content, "tool_calls": calls}


def call(name, arguments, call_id=None):
    entry = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not None:
        entry = {"id": call_id, **entry}
    return entry


def tool_result(content, call_id=None):
    message = {"role": "tool", "content": content}
    if call_id is not None:
        message["tool_call_id"] = call_id
    return message


BASIC = [system("You are terse."), user("Hi there!")]
MULTI_TURN = [system("Be kind."), user("What is 2+2?"), assistant("4"), user("And 3+3?")]
ASSISTANT_LAST = [user("Say hi"), assistant("  Hi!  ")]
UNICODE = [user("Grüße, 世界! 😀 \"quotes\" and \\backslash\\ "), assistant("¡Hola!")]
TEXT_PARTS = [{"role": "user", "content": [{"type": "text", "text": "first part"}, {"type": "text", "text": "second"}]}]

# (template name, source, bos, eos, cases); a case: (name, messages, add_generation_prompt, extra)
CONVERSATIONS = [
    ("qwen3", "shared:models/qwen3-tokenizer/tokenizer_config.json", None, None, [
        ("user_only", [user("Hello")], True, {}),
        ("system_user", BASIC, True, {}),
        ("multi_turn_no_prompt", MULTI_TURN + [assistant("6")], False, {}),
        ("assistant_think_in_content", [user("q1"), assistant("<think>\nreasoning one\n</think>\n\nanswer one"), user("q2"),
                                        assistant("<think>\nr2\n</think>\n\nanswer two")], False, {}),
        ("reasoning_content_field", [user("q"), {"role": "assistant", "content": "ans", "reasoning_content": "because"}],
         False, {}),
        ("thinking_field_alias", [user("q"), {"role": "assistant", "content": "ans", "thinking": "via thinking"}], False, {}),
        ("tools_and_calls", [system("Use tools."), user("Weather in Paris?"),
                             tool_call_message([call("get_weather", {"city": "Paris", "days": [1, 2]})], content=""),
                             tool_result('{"temp": 21}'), tool_result("second result"), user("Thanks")], True,
         {"tools": [WEATHER_TOOL, SEARCH_TOOL]}),
        ("tool_call_string_arguments", [user("find x"), tool_call_message([call("search", '{"q": "x"}')], content="Looking."),
                                        tool_result("found")], True, {"tools": [SEARCH_TOOL]}),
        ("enable_thinking_false", [user("quick")], True, {"enable_thinking": False}),
        ("enable_thinking_true", [user("slow")], True, {"enable_thinking": True}),
        ("unicode", UNICODE, True, {}),
        ("text_parts", TEXT_PARTS, True, {}),
    ]),
    ("llama3_1", "shared:models/llama3_1-tokenizer/tokenizer_config.json", None, None, [
        ("system_user", BASIC, True, {}),
        ("multi_turn", MULTI_TURN, True, {}),
        ("assistant_last_no_prompt", ASSISTANT_LAST, False, {}),
        ("whitespace_trimmed", [user("  \n padded \t\n")], True, {}),
        ("unicode", UNICODE, False, {}),
        ("text_parts", TEXT_PARTS, False, {}),
    ]),
    ("deepseek_v3", "shared:models/deepseek_v3-tokenizer/tokenizer_config.json", None, None, [
        ("system_user", BASIC, True, {}),
        ("two_system_messages", [system("one"), system("two"), user("hi")], True, {}),
        ("multi_turn_no_prompt", MULTI_TURN + [assistant("6")], False, {}),
        ("tool_calls", [user("weather?"),
                        tool_call_message([call("get_weather", '{"city": "Oslo"}'), call("search", '{"q": "Oslo"}')]),
                        tool_result("cold"), tool_result("north"), assistant("It is cold.")], True, {}),
        ("tool_output_last", [user("weather?"), tool_call_message([call("get_weather", '{"city": "Rome"}')]),
                              tool_result("warm")], True, {}),
        ("unicode", UNICODE, True, {}),
    ]),
    ("llama2_style", "fixtures:templates/llama2_style.jinja", "<s>", "</s>", [
        ("user_only", [user("Hello")], True, {}),
        ("system_multi_turn", MULTI_TURN, False, {}),
        ("assistant_last", [system("sys")] + ASSISTANT_LAST, False, {}),
        ("roles_not_alternating", [user("a"), user("b")], True, {}),
        ("unknown_role", [user("a"), {"role": "robot", "content": "b"}], True, {}),
        ("unicode", UNICODE, True, {}),
    ]),
    ("phi_style", "fixtures:templates/phi_style.jinja", "<s>", "<|endoftext|>", [
        ("system_user", BASIC, True, {}),
        ("multi_turn", MULTI_TURN, False, {}),
        ("assistant_first", [assistant("hi")], True, {}),
    ]),
    ("tool_macros", "fixtures:templates/tool_macros.jinja", "<bos>", "<eos>", [
        ("no_tools", MULTI_TURN, True, {}),
        ("tools_and_calls", [user("Weather in Paris and Rome?"),
                             tool_call_message([call("get_weather", {"city": "Paris", "unit": "c"}),
                                                call("get_weather", {"city": "Rome", "extra": {"a": 1.5}})]),
                             tool_result("21C"), tool_result({"temp": 25, "sky": "clear"}), assistant("Warm.")], True,
         {"tools": [WEATHER_TOOL, SEARCH_TOOL["function"]]}),
        ("tools_generation_prompt_after_assistant", [user("x"), assistant("y")], True, {"tools": [SEARCH_TOOL]}),
    ]),
    ("mistral_style", "fixtures:templates/mistral_style.jinja", "<s>", "</s>", [
        ("system_multi_turn", MULTI_TURN, False, {}),
        ("tools", [user("first"), assistant("ok"), user("weather in Lima?"),
                   tool_call_message([call("get_weather", {"city": "Lima"}, call_id="abc123XYZ")]),
                   tool_result({"temp": 18}, call_id="abc123XYZ"), assistant("18 degrees")], False,
         {"tools": [WEATHER_TOOL]}),
        ("bad_tool_call_id", [user("q"), tool_call_message([call("search", {"q": "x"}, call_id="short")])], False, {}),
        ("not_alternating", [user("a"), assistant("b"), assistant("c")], False, {}),
    ]),
    ("llama32_style", "fixtures:templates/llama32_style.jinja", "<|begin_of_text|>", "<|eot_id|>", [
        ("system_user", BASIC, True, {"date_string": "26 Jul 2024"}),
        ("tools_in_user_message", [system("sys"), user("  Weather?  "),
                                   tool_call_message([call("get_weather", {"city": "Lima"})]),
                                   tool_result({"temp": 18}), tool_result("plain")], True,
         {"tools": [WEATHER_TOOL], "date_string": "01 Jan 2025"}),
        ("tools_in_system", [user("q")], True,
         {"tools": [SEARCH_TOOL], "tools_in_user_message": False, "date_string": "02 Feb 2025"}),
        ("no_user_for_tools", [system("only system")], True, {"tools": [SEARCH_TOOL], "date_string": "x"}),
        ("two_tool_calls", [user("q"), tool_call_message([call("a", {}), call("b", {})])], False,
         {"date_string": "x"}),
    ]),
    ("content_parts", "fixtures:templates/content_parts.jinja", None, None, [
        ("parts_passed_through", [{"role": "user", "content": [{"type": "text", "text": "look"},
                                                               {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]},
                                  {"role": "assistant", "content": "a cat", "reasoning_content": "pixels"}], True, {}),
        ("string_content", [user("plain"), {"role": "assistant", "content": "ok", "reasoning": "alias"}], False, {}),
    ]),
    ("chatml_generation", "fixtures:templates/chatml_generation.jinja", None, None, [
        ("basic", BASIC + [assistant("Hello!")], True, {}),
        ("names_repeats_and_stop", [user("a"), {"role": "user", "content": "b", "name": "bob"}, system("late"),
                                    {"role": "stop", "content": ""}, user("never")], False, {}),
    ]),
]


def content_is_iterated(template):
    """Mirrors ChatTemplate's detection: some for loop iterates a `content` value."""
    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda *a, **k: ""
    source = template.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    tree = env.parse(source)

    def mentions(node):
        if isinstance(node, jinja2.nodes.Getattr) and node.attr == "content":
            return True
        if isinstance(node, jinja2.nodes.Name) and node.name == "content":
            return True
        if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == "content":
            return True
        return any(mentions(child) for child in node.iter_child_nodes())

    return any(mentions(loop.iter) for loop in tree.find_all(jinja2.nodes.For))


def join_text_parts(messages):
    joined = []
    for message in messages:
        if isinstance(message.get("content"), list):
            message = {**message, "content": "\n".join(part["text"] for part in message["content"])}
        joined.append(message)
    return joined


def render(template, messages, add_generation_prompt, bos, eos, extra):
    """apply_chat_template without a tokenizer: it drops the None-valued keys of each message first."""
    messages = [{k: v for k, v in message.items() if v is not None} for message in messages]
    kwargs = dict(extra)
    if bos is not None:
        kwargs.setdefault("bos_token", bos)
    if eos is not None:
        kwargs.setdefault("eos_token", eos)
    tools = kwargs.pop("tools", None)
    documents = kwargs.pop("documents", None)
    rendered, _ = render_jinja_template(conversations=[messages], tools=tools, documents=documents,
                                        chat_template=template, add_generation_prompt=add_generation_prompt, **kwargs)
    return rendered[0]


def outcome(fn):
    try:
        return {"expected": fn()}
    except jinja2.TemplateError as e:
        if type(e) is jinja2.TemplateError:  # raise_exception
            return {"error": str(e), "raised": True}
        return {"error": f"{type(e).__name__}: {e}"}
    except Exception as e:  # noqa: BLE001 - Python errors inside the template (TypeError, ...)
        return {"error": f"{type(e).__name__}: {e}"}


def engine_cases():
    cases = []
    for name, template, variables in ENGINE_CASES:
        variables = dict(variables)
        messages = variables.pop("messages", [])
        result = outcome(lambda: render(template, messages, False, None, None, variables))
        if "error" in result:
            raise SystemExit(f"engine case {name} failed in jinja2: {result['error']}")
        case = {"name": name, "template": template, "variables": variables}
        if messages:
            case["messages"] = messages
        cases.append({**case, **result})
    for name, template, variables, fragment in ENGINE_ERRORS:
        result = outcome(lambda: render(template, [], False, None, None, variables))
        if "error" not in result:
            raise SystemExit(f"error case {name} rendered without error: {result['expected']!r}")
        case = {"name": name, "template": template, "variables": variables}
        if fragment is None:
            if not result.get("raised"):
                raise SystemExit(f"error case {name}: expected raise_exception, got {result['error']}")
            case["raise_exception_message"] = result["error"]
        else:
            if fragment not in result["error"]:
                raise SystemExit(f"error case {name}: {fragment!r} not in jinja2's message {result['error']!r}")
            case["error_contains"] = fragment
            case["jinja2_error"] = result["error"]
        cases.append(case)
    for name, template in SYNTAX_ERRORS:
        try:
            _compile_jinja_template(template)
        except jinja2.TemplateSyntaxError as e:
            cases.append({"name": name, "template": template, "syntax_error_line": e.lineno,
                          "jinja2_error": f"{type(e).__name__}: {e.message}"})
            continue
        except SyntaxError as e:  # jinja2 leaves some checks to Python's compiler
            cases.append({"name": name, "template": template, "syntax_error_line": None,
                          "jinja2_error": f"SyntaxError: {e.msg}"})
            continue
        raise SystemExit(f"syntax case {name} compiled")
    return cases


def load_template(source, shared, out):
    kind, path = source.split(":", 1)
    if kind == "shared":
        config = json.loads((shared / path).read_text(encoding="utf-8"))
        return config["chat_template"], shared / path
    return (out / path).read_text(encoding="utf-8"), out / path


def conversations(shared, out):
    templates = []
    for name, source, bos, eos, cases in CONVERSATIONS:
        template, path = load_template(source, shared, out)
        iterated = content_is_iterated(template)
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent)) if source.startswith("shared:") else None
        entry = {"name": name, "source": source, "cases": []}
        if tokenizer is None:
            entry["bos_token"] = bos or ""
            entry["eos_token"] = eos or ""
        for case_name, messages, add_generation_prompt, extra in cases:
            has_parts = any(isinstance(m.get("content"), list) for m in messages)
            prepared = messages if iterated or not has_parts else join_text_parts(messages)
            if tokenizer is not None:
                result = outcome(lambda: tokenizer.apply_chat_template(
                    prepared, tokenize=False, add_generation_prompt=add_generation_prompt, **extra))
                # The C++ side gets bos/eos only; the template must not depend on other special tokens.
                check = outcome(lambda: render(template, prepared, add_generation_prompt,
                                               tokenizer.bos_token, tokenizer.eos_token, extra))
                if check != result:
                    raise SystemExit(f"{name}/{case_name}: apply_chat_template and render_jinja_template differ")
            else:
                result = outcome(lambda: render(template, prepared, add_generation_prompt, bos, eos, extra))
            case = {"name": case_name, "messages": messages, "add_generation_prompt": add_generation_prompt,
                    "extra": extra}
            if has_parts and not iterated:
                case["joined_content_parts"] = True
            if "error" in result and result.get("raised"):
                case["raise_exception_message"] = result["error"]
            elif "error" in result:
                if not result["error"].startswith("UndefinedError: "):
                    raise SystemExit(f"{name}/{case_name}: unexpected error {result['error']}")
                case["error_contains"] = result["error"][len("UndefinedError: "):]
                case["jinja2_error"] = result["error"]
            else:
                case["expected"] = result["expected"]
            entry["cases"].append(case)
        templates.append(entry)
    return templates


def named_templates_config(out):
    default = (out / "templates" / "llama2_style.jinja").read_text(encoding="utf-8")
    tool_use = (out / "templates" / "tool_macros.jinja").read_text(encoding="utf-8")
    added = lambda content: {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": True,
                             "rstrip": False, "single_word": False}
    return {"bos_token": added("<s>"), "eos_token": added("</s>"),
            "chat_template": [{"name": "tool_use", "template": tool_use}, {"name": "default", "template": default}]}


def without_versions(text):
    """The fixture without the recorded package versions, which --check does not compare."""
    value = json.loads(text)
    if isinstance(value, dict):
        value.pop("transformers", None)
        value.pop("jinja2", None)
    return value


def gguf_with_template(out):
    """A GGUF file without tensors whose metadata carries a chat template (llama.cpp's keys)."""
    import tempfile
    import gguf
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.add_string("tokenizer.chat_template", (out / "templates" / "llama2_style.jinja").read_text(encoding="utf-8"))
        writer.add_array("tokenizer.ggml.tokens", ["<unk>", "<s>", "</s>"])
        writer.add_uint32("tokenizer.ggml.bos_token_id", 1)
        writer.add_uint32("tokenizer.ggml.eos_token_id", 2)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path.read_bytes()


def dump(value):
    return json.dumps(value, ensure_ascii=False, indent=1) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", type=Path, default=REPO.parent / "shared")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "chat")
    parser.add_argument("--check", action="store_true", help="compare with the files on disk instead of writing")
    args = parser.parse_args()

    meta = {"generator": "python/make_chat_fixtures.py", "transformers": transformers.__version__,
            "jinja2": jinja2.__version__}
    files = {
        "engine_cases.json": dump({**meta, "cases": engine_cases()}),
        "conversations.json": dump({**meta, "templates": conversations(args.shared, args.out)}),
        "named_templates/tokenizer_config.json": dump(named_templates_config(args.out)),
        "gguf/model.gguf": gguf_with_template(args.out),
    }
    stale = []
    for relative, content in files.items():
        path = args.out / relative
        if args.check:
            if isinstance(content, bytes):
                fresh = path.exists() and path.read_bytes() == content
            else:
                fresh = path.exists() and without_versions(path.read_text(encoding="utf-8")) == without_versions(content)
            if not fresh:
                stale.append(relative)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content, encoding="utf-8")
    if stale:
        print("stale fixtures (re-run python/make_chat_fixtures.py):", ", ".join(stale))
        return 1
    print("checked" if args.check else "wrote", ", ".join(files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
