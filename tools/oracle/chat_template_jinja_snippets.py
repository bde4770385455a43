#!/usr/bin/env python3
"""Jinja-semantics oracle: renders small templates in HF's chat-template environment and records the results.

Writes tests/fixtures/chat_template/jinja_snippets.json: template text, variables, and the exact output or the
error message. tests/test_jinja_snippets.cpp renders each with qspec's interpreter and compares. Errors whose
wording is Python-specific are marked "error_any": only the fact of the error is compared.

    /work/oracle-venv/bin/python tools/oracle/chat_template_jinja_snippets.py
"""

import jinja2
from transformers.utils.chat_template_utils import _compile_jinja_template

from chat_template_fixture import write_fixture

MESSAGES = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "n": 2}]}

# (template, variables, error wording is Python-specific)
SNIPPETS = [
    # whitespace control, trim_blocks, lstrip_blocks, comments, raw
    ("  {% if true %}\n  x\n  {% endif %}\n", {}, False),
    ("{{- ' a ' -}}   {# c #}  \n  b\n", {}, False),
    ("a\n  {#- c #}\nb", {}, False),
    ("x  {%+ if true %}y{% endif %}", {}, False),
    ("{% if true +%}\ny{% endif %}", {}, False),
    ("a  \n  {%- if true -%}  \n b {%- endif %}\n c", {}, False),
    ("line1\r\nline2\r{{ 'x' }}\n\n", {}, False),
    ("{% raw %}{{ not evaluated }}{% endraw %}|{%- raw -%}  {% x %}  {%- endraw %}|", {}, False),
    ("{# only a comment #}\n", {}, False),
    ("\t{% for i in [1,2] %}\n\t{{ i }}\n\t{% endfor %}\n", {}, False),
    ("\u00a0{% if true %}x{% endif %}|a\u3000 {%- if true %}b{% endif %}|\n\u2003{# c #}\u2003\n", {}, False),
    ("{{ '\u00a0x\u2028'|trim }}|{{ 'a\u00a0b'.split() }}|{{ '\u00e9t\u00e9'|capitalize }}", {}, False),
    ("{{ 1 }}  {% if true %}\n x{% endif %}", {}, False),
    # literals and printing
    ("{{ [1, 'a', none, true, 1.5, {'k': (1,)}] }}", {}, False),
    ("{{ (1, ) }}{{ (1) }}{{ () }}{{ 1, 2 }}", {}, False),
    ("{{ 'it''s' }}{{ \"a\\tb\\n\\u00e9\\x41\\\\\" }}", {}, False),
    ("{{ [\"it's\", 'a\"b', 'x\\ny', 'é😀\\u200b\\x07'] }}", {}, False),
    ("{{ 4/2 }} {{ 7//2 }} {{ -7//2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2**10 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }}", {}, False),
    ("{{ 3.0 }} {{ 1.5e-7 }} {{ 123456789012345678.0 }} {{ 0.1+0.2 }} {{ -0.0 }} {{ 1e22 }} {{ 1_000 }} {{ 0x1F }}", {}, False),
    ("{{ 7 // 2.0 }} {{ 7 % 2.5 }} {{ 2 ** -1 }} {{ 2 ** 0.5 }} {{ -2 ** 2 }} {{ 10 - 2 - 3 }}", {}, False),
    ("{{ 'a' + 'b' ~ 'c' }} {{ 'x' ~ 1 ~ none ~ true ~ 1.0 ~ [1] }} {{ [1,2] + [3] }} {{ 'ab' * 3 }} {{ [0] * 2 }}", {}, False),
    ("{{ none }}|{{ true }}|{{ undefined_name }}|{{ 1 == 1.0 }}|{{ true == 1 }}", {}, False),
    ("{{ {'b': 1, 'a': 2} }}{{ dict(x=1, y=[2]) }}{{ namespace(a=1) }}", {}, False),
    # operators and logic
    ("{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'a' < 'b' }}{{ [1,2] < [1,3] }}", {}, False),
    ("{{ true and 'x' }}|{{ false or 0 }}|{{ '' or [] }}|{{ not 'a' }}|{{ none or 'd' }}", {}, False),
    ("{{ 'a' in 'cat' }}{{ 'z' not in 'cat' }}{{ 2 in [1,2] }}{{ 'k' in {'k': 1} }}{{ 'x' in undefined_name }}", {}, False),
    ("{{ 'a' if 1 else 'b' if 2 else 'c' }}|{{ 'x' if false }}|{{ ('x' if false) is defined }}", {}, False),
    ("{{ -3|abs }}{{ -(3) }}{{ +2 }}{{ not none }}", {}, False),
    # subscripts, slices, attributes
    ("{{ 'abc'[::-1] }}|{{ 'abc'[5] }}|{{ [1,2][5] }}|{{ 'abc'[1:] }}|{{ [1,2,3][-1] }}|{{ [1,2,3][::2] }}|{{ 'abcdef'[-2:0:-1] }}", {}, False),
    ("{{ [[1,2]][0].1 }}{{ messages[0].role }}{{ messages[1]['content'] }}{{ messages[-1].n + 1 }}", MESSAGES, False),
    ("{{ messages[::-1]|map(attribute='role')|join(',') }}{{ messages[5] is defined }}", MESSAGES, False),
    ("{{ none.x }}|{{ none[0] }}|{{ (5)[0] }}|{{ {'a': 1}.b }}|{{ 'héllo'[1] }}", {}, False),
    ("{{ {'a':1}.get('a') }}{{ {'a':1}.get('b') }}{{ {'a':1}.get('b', 2) }}{{ {'a':1}.keys()|list }}{{ {'a':1}.values()|list }}{{ {'a':1}.items()|list }}", {}, False),
    # loops
    ("{% for a, b in {'x': 1, 'y': 2}|items %}{{a}}={{b}};{% endfor %}", {}, False),
    ("{% for x in [1,2,3,4] if x is even %}{{ loop.index }}/{{ loop.length }}:{{ x }}{{ loop.last }};{% endfor %}", {}, False),
    ("{% for x in [1,2,3] %}{{ loop.previtem }}|{{ loop.nextitem }}|{{ loop.revindex }}|{{ loop.revindex0 }}|{{ loop.first }};{% endfor %}", {}, False),
    ("{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% if x == 3 %}{% break %}{% endif %}{% endfor %}", {}, False),
    ("{% for x in [1] %}{% for y in [2, 3] %}{{ loop.index }}{{ x }}{% endfor %}{{ loop.index }}{% endfor %}", {}, False),
    ("{% for x in [] %}a{% else %}empty{% endfor %}{% for x in undefined_name %}a{% else %}u{% endfor %}", {}, False),
    ("{% for k in {'a':1,'b':2} %}{{ k }}{% endfor %}{% for c in 'hé' %}[{{ c }}]{% endfor %}", {}, False),
    ("{% for x in 'abc' %}{{ loop.cycle('o', 'e') }}{% endfor %}", {}, False),
    ("{% for i in [1,2] %}{% if i == 2 %}[{{ x }}]{% endif %}{% set x = i %}{% endfor %}[{{ x }}]", {}, False),
    ("{% set x = 1 %}{% for i in [1] %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}", {}, False),
    ("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", {}, False),
    # set, namespace, macros, with, filter blocks
    ("{% set ns = namespace(a=1) %}{% set ns.a = ns.a + 1 %}{% set ns.b = 'x' %}{{ ns.a }}{{ ns.b }}{{ ns.c }}", {}, False),
    ("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set x %}A{{ a }}B{% endset %}{{ x|lower }}", {}, False),
    ("{% set x %}  padded  {% endset %}[{{ x }}]{% set y | trim | upper %}  y  {% endset %}[{{ y }}]", {}, False),
    ("{% if true %}{% set z = 5 %}{% endif %}{{ z }}", {}, False),
    ("{% macro m(a, b=2) %}[{{a}},{{b}}]{% endmacro %}{{ m(1) }}{{ m(1, b=3) }}{{ m() }}{{ m(b=7, a=6) }}", {}, False),
    ("{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}", {}, False),
    ("{% macro m() %}{{ y }}{% endmacro %}{% set y = 3 %}{{ m() }}", {}, False),
    ("{% macro outer(n) %}{% if n > 0 %}{{ n }}{{ outer(n - 1) }}{% endif %}{% endmacro %}{{ outer(5) }}", {}, False),
    ("{% macro m(x) %}{% set x = x * 2 %}{{ x }}{% endmacro %}{% set x = 1 %}{{ m(5) }}{{ x }}", {}, False),
    ("{% macro m(a, b=a ~ '!') %}{{ b }}{% endmacro %}{{ m('hi') }}", {}, False),
    ("{% with a = 1 %}{{ a }}{% endwith %}[{{ a }}]", {}, False),
    ("{% filter upper %}abc{{ 'd' }}{% endfilter %}", {}, False),
    ("{% generation %}gen{{ 1 }}{% endgeneration %}", {}, False),
    # filters
    ("{{ 'x'|indent(2) }}|{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent('> ', blank=true) }}", {}, False),
    ("{{ '42'|int + '4.5'|int + 'x'|int }}|{{ '4.5'|float }}|{{ 1.5|int }}|{{ true|int }}|{{ '0x1A'|int(0, 16) }}|{{ '  7 '|int }}|{{ 'x'|int(9) }}|{{ '1e3'|float }}", {}, False),
    ("{{ [1,2]|first }}{{ []|first }}{{ 'abc'|last }}{{ [1,2]|join('-') }}{{ {'a':1}|list }}{{ 'abc'|list }}", {}, False),
    ("{{ undefined_name|default('d') }}{{ none|default('d') }}{{ none|default('d', true) }}{{ ''|d('e', true) }}{{ 0|d(5) }}", {}, False),
    ("{{ [3,1,2]|sort }}{{ [1,2,2]|unique|list }}{{ ['b','A','a']|sort }}{{ ['b','A','a']|unique|list }}{{ [3,1,2]|sort(reverse=true) }}", {}, False),
    ("{{ [{'a':1},{'a':2}]|map(attribute='a')|list }}{{ [{'a':1},{'b':2}]|selectattr('a','defined')|list }}{{ [{'a':1},{'b':2}]|rejectattr('a')|list }}", {}, False),
    ("{{ [{'a':{'b':5}}]|map(attribute='a.b')|list }}{{ [{'a':1}]|map(attribute='x', default=9)|list }}{{ ['a','b']|map('upper')|list }}", {}, False),
    ("{{ [1,2,3]|select('odd')|list }}{{ [1,2,3]|reject('odd')|list }}{{ [0,1,'']|select|list }}{{ [1,2,3]|select('gt', 1)|list }}{{ ['a','b']|select('equalto','b')|list }}", {}, False),
    ("{{ 'aXbXc'|replace('X','-') }}{{ 'aXbXc'|replace('X','-', 1) }}{{ 'a\\tb'|string }}{{ none|string }}{{ 42|string }}{{ [1, 'a']|string }}", {}, False),
    ("{{ 'Hello World'|wordcount }}{{ 'hello-world (foo) x'|title }}{{ 'hELLO wORLD'|capitalize }}{{ 'MiXed'|lower }}{{ 'MiXed'|upper }}", {}, False),
    ("{{ [1,2,3]|sum }}{{ [1,3,2]|max }}{{ [1,3,2]|min }}{{ [{'v': 2}, {'v': 5}]|sum(attribute='v') }}{{ [1,2]|reverse|list }}{{ 'abc'|reverse }}", {}, False),
    ("{{ {'b': 1, 'a': 2}|dictsort }}{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 5|round }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(method='floor') }}", {}, False),
    ("{{ '  x  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'abc'|length }}{{ [1,2]|count }}{{ {'a': 1}|length }}|{{ 'ab'|center(6) }}|", {}, False),
    ("{{ 'héllo'|length }}{{ 'héllo'|upper }}{{ 'ÉCOLE'|lower }}{{ '<b>'|safe }}{{ 5|safe }}", {}, False),
    ("{{ {'a': 1}|tojson(indent=2) }}|{{ [1,[2,{}],[]]|tojson(indent=2) }}|{{ {'a':{'b':1}}|tojson(indent='\\t') }}", {}, False),
    ("{{ 'é\"\\n\\x01\\x7f/<>&'|tojson }}{{ 1.0|tojson }} {{ 1e20|tojson }} {{ none|tojson }} {{ (1, 'a')|tojson }} {{ {1: 'a', none: 2}|tojson }}", {}, False),
    ("{{ {'b':1,'a':[1,2]}|tojson(sort_keys=true) }}{{ [1,2]|tojson(separators=(',', ':')) }}{{ 'é'|tojson(ensure_ascii=true) }}{{ '😀'|tojson(ensure_ascii=true) }}", {}, False),
    ("{{ messages|tojson }}", MESSAGES, False),
    ("{{ undefined_name|trim }}{{ undefined_name|upper }}{{ undefined_name|first }}{{ undefined_name|join(',') }}{{ undefined_name|string }}{{ undefined_name|list }}{{ undefined_name|items|list }}{{ undefined_name|length }}", {}, False),
    # tests
    ("{{ 'abc' is string }}{{ 1 is number }}{{ true is number }}{{ true is integer }}{{ 1.0 is float }}{{ none is none }}{{ {} is mapping }}{{ [] is mapping }}", {}, False),
    ("{{ x is sequence }}{{ none is iterable }}{{ 'a' is iterable }}{{ 1 is iterable }}{{ 3 is odd }}{{ 4 is divisibleby 2 }}{{ 1 is in [1] }}{{ none is sameas none }}", {}, False),
    ("{{ {} is sequence }}{{ 'a' is sequence }}{{ true is boolean }}{{ 1 is boolean }}{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 'ab' is lower }}{{ 'AB' is upper }}", {}, False),
    ("{{ 1 is eq 1 }}{{ 1 is ne 2 }}{{ 1 is lt 2 }}{{ 2 is ge 2 }}{{ 'a' is not defined }}{{ x is not defined }}{{ x is undefined }}", {}, False),
    # string methods
    ("{{ 'a b  c'.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}{{ ' x '.strip() }}{{ 'xxhixx'.strip('x') }}", {}, False),
    ("{{ 'hello world'.title() }}{{ 'hELLO'.capitalize() }}{{ 'abc'.find('c') }}{{ 'abc'.find('z') }}{{ 'aaa'.count('a') }}{{ 'hello world\\'s'.title() }}", {}, False),
    ("{{ 'a,b'.split(',', maxsplit=1) }}{{ ' a b '.split(none, 1) }}{{ 'a b c'.rsplit(' ', 1) }}{{ '  a  b  '.rsplit(none, 1) }}{{ 'l1\\nl2\\r\\nl3'.splitlines() }}", {}, False),
    ("{{ 'abc'.startswith(('x','a')) }}{{ 'abc'.endswith('bc') }}{{ 'aXbXc'.replace('X', '-', 1) }}{{ '-'.join(['a', 'b']) }}{{ 'AbC'.upper() }}{{ 'AbC'.lower() }}", {}, False),
    ("{{ '{} {}'.format(1, 'a') }}{{ '{0}{1}{0}'.format('x', 'y') }}{{ '{name}!'.format(name='n') }}{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ ' '.isspace() }}", {}, False),
    ("{{ '\\n\\n  x \\t'.lstrip() }}|{{ 'x\\n\\n'.rstrip('\\n') }}|{{ '<think>a</think>b'.split('</think>')[0].split('<think>')[-1] }}", {}, False),
    # constructs of other real templates (gpt-oss, Hermes, Llama)
    ("{%- macro m(a) -%}\n  [{{ a }}]\n{%- endmacro -%}\n{{ m(1) }} {{ m('x') }}", {}, False),
    ("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% endfor %}{{ 'x' not in (none or []) }}", {}, False),
    ("{% set l = [1, 2, 3] %}{% for x in l %}{{ l[loop.index:] }}{% endfor %}", {}, False),
    ("{{ (a.b if a.b is defined else 'json') + '!' }}{{ {'s': 'str'}[a.type] is defined }}", {"a": {}}, False),
    ("{% macro t(s) %}{% if s.type is iterable %}U[{% for x in s.type %}{{ x }}{% endfor %}]{% endif %}{% endmacro %}{{ t({'type': 'ab'}) }}{{ t([1]) }}", {}, False),
    ("{{ ['a', 'b', 'code']|reject('equalto', 'code')|join(', ') }}{{ messages|selectattr('role', 'equalto', 'user')|list|length }}", MESSAGES, False),
    ("{% for m in messages %}{% if loop.previtem and loop.previtem.role != m.role %}<{{ m.role }}>{% endif %}{% endfor %}", MESSAGES, False),
    ("{{ strftime_now('%Y') | length }}{{ messages | length is even }}", MESSAGES, False),
    # errors
    ("{{ messages[0].foo.bar }}", MESSAGES, False),
    ("{{ messages[0].foo + 1 }}", MESSAGES, False),
    ("{{ undefined_name.x }}", {}, False),
    ("{{ undefined_name + 'x' }}", {}, False),
    ("{{ undefined_name() }}", {}, False),
    ("{{ undefined_name|tojson }}", {}, True),
    ("{{ 'a' in none }}", {}, False),
    ("{{ 1 in 'abc' }}", {}, False),
    ("{% for x in 5 %}{% endfor %}", {}, False),
    ("{{ 5|length }}", {}, False),
    ("{{ 1/0 }}", {}, False),
    ("{{ 1 < 'a' }}", {}, False),
    ("{{ -'a' }}", {}, False),
    ("{{ 1 + 'a' }}", {}, False),
    ("{{ [].append(1) }}", {}, False),
    ("{% set l = [] %}{{ l.append(1) }}", {}, False),
    ("{% set ns.x = 1 %}", {}, True),
    ("{% set x = 5 %}{% set x.y = 1 %}", {}, True),
    ("{{ range(100001)|length }}", {}, False),
    ("{{ range(5)|list }}{{ range(1, 10, 3)|list }}{{ range(5, 0, -2)|list }}", {}, False),
    ("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", {}, False),
    ("{% macro m(a) %}{% endmacro %}{{ m(b=1) }}", {}, False),
    ("{{ raise_exception('boom at ' ~ 42) }}", {}, False),
    ("{{ 'x'|items|list }}", {}, False),
    ("{{ x|indent }}", {}, False),
    ("{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}, False),
    ("{{ 'x'|round }}", {}, True),
    ("{{ [1, 'a']|sort }}", {}, True),
    ("{{ 1|nosuchfilter }}", {}, True),
    ("{{ 1 is nosuchtest }}", {}, True),
    ("{% if x %}", {}, True),
    ("{{ x ", {}, True),
    ("{% foo %}", {}, True),
    ("{% for x in y %}{% endif %}", {}, True),
    ("{% break %}", {}, True),
    ("{{ (1 }}", {}, True),
    ("{{ 1 ]] }}", {}, True),
    ("{# unclosed comment", {}, True),
    ("{{ 'unterminated }}", {}, True),
    ("{% endfor %}", {}, True),
    ("{% if true %}{% else %}{% elif false %}{% endif %}", {}, True),
    ("{{ }}", {}, True),
    ("{{ a.  }}", {}, True),
    ("{{ 1 @ 2 }}", {}, True),
]


def main():
    records = []
    for template, variables, error_any in SNIPPETS:
        record = {"template": template, "variables": variables}
        try:
            record["expected"] = _compile_jinja_template(template).render(**variables)
        except Exception as error:  # the oracle records every failure, whatever its type
            record["error"] = str(error)
            if error_any:
                record["error_any"] = True
        records.append(record)
    fixture = {
        "generator": "tools/oracle/chat_template_jinja_snippets.py",
        "jinja2": jinja2.__version__,
        "snippets": records,
    }
    write_fixture("jinja_snippets.json", fixture, records, "snippets")


if __name__ == "__main__":
    main()
