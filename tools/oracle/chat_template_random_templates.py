#!/usr/bin/env python3
"""Differential oracle: random well-formed templates (whitespace control, trim/lstrip, nesting, loops,
filters, tests) rendered by jinja2 in HF's chat-template environment.

Writes tests/fixtures/chat_template/random_templates.json (template, variables, output or error);
tests/test_jinja_random_templates.cpp renders each with qspec's interpreter and compares byte for byte.

    /work/oracle-venv/bin/python tools/oracle/chat_template_random_templates.py
"""

import random

import jinja2
from transformers.utils.chat_template_utils import _compile_jinja_template

from chat_template_fixture import write_fixture

SEED = 20261129
COUNT = 500

VARIABLES = {
    "messages": [
        {"role": "system", "content": "  Be brief.\n"},
        {"role": "user", "content": "Héllo 😀 <tool_response>x</tool_response>"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHi!", "tool_calls": [{"name": "f", "arguments": {"a": 1, "b": [True, None]}}]},
    ],
    "flag": True,
    "count": 3,
    "ratio": 0.25,
    "empty": "",
    "nothing": None,
}

TEXTS = ["", " ", "  ", "\n", " \n ", "\t", "a", "b c", "\n\n", "  x  \n", "\n  ", "y\n", "   \t\n\n z"]
START = ["", "-", "+"]
END_BLOCK = ["", "-", "+"]
END_VARIABLE = ["", "-"]
FILTERS = ["string", "trim", "upper", "lower", "length", "tojson", "default('d')", "first", "list", "capitalize",
           "replace('a', 'b')", "title", "reverse|list", "last", "unique|list", "join(',')", "trim('x')", "center(9)"]
CONTAINERS = ["messages[1].content", "[1, 2, 3]", "{'k': 1}", "empty"]


def pick(rng, items):
    return items[rng.randrange(len(items))]


def atom(rng, in_loop):
    atoms = [
        "'s'", "\"d q\"", "1", "2.5", "-3", "true", "none", "count", "ratio", "flag", "empty", "nothing",
        "missing", "messages|length", "messages[0].role", "messages[-1].content", "messages[1]['content']",
        "messages[2].tool_calls[0].arguments", "[1, 'two', none]", "{'k': 'v', 'n': 2}", "(1, 2)",
        "messages[0].content|trim", "range(3)|list", "'a,b'.split(',')", "namespace(v=1).v",
        "messages[1].content[::-1]", "messages[1].content[2:5]", "messages[1].content.split(' ')",
        "'  pad '.strip()", "messages[0].content.rstrip('\\n')", "messages|selectattr('role', 'equalto', 'user')|list",
        "messages[2].tool_calls[0].arguments|items|list", "messages[2].tool_calls[0].arguments|tojson(indent=2)",
        "messages|map(attribute='role')|join('|')", "{'b': 1, 'a': 2}|dictsort", "[3, 1, 2]|sort", "ratio|round(1)",
        "count|float", "'7'|int", "messages[1].content|wordcount", "'x\\ny'|indent(2)", "messages[2].content.split('</think>')[-1].lstrip('\\n')",
        "messages[1].content.startswith('H')", "messages|rejectattr('role', 'equalto', 'system')|map(attribute='role')|list",
        "(messages|last).role", "messages[0].get('role')", "messages[2].tool_calls[0].arguments.get('zz', 'dflt')",
        "'{} and {}'.format(count, ratio)", "[1, [2, 3]]|tojson", "'ÉTÉ'|lower", "'a-b c'|title", "count ** 2", "-ratio|abs",
    ]
    if in_loop:
        atoms += ["loop.index", "loop.index0", "loop.first", "loop.last", "loop.length", "loop.revindex", "item",
                  "loop.previtem", "loop.nextitem"]
    return pick(rng, atoms)


def expression(rng, in_loop, depth=0):
    base = atom(rng, in_loop)
    if depth > 2:
        return base
    choice = rng.randrange(12)
    if choice == 0:
        return f"{base} ~ {expression(rng, in_loop, depth + 1)}"
    if choice == 1:
        return base + "|" + pick(rng, FILTERS)
    if choice == 2:
        return f"({base} is {pick(rng, ['defined', 'none', 'string', 'number', 'mapping', 'iterable', 'sequence', 'even', 'true'])})"
    if choice == 3:
        return f"({expression(rng, in_loop, depth + 1)} if {condition(rng, in_loop, depth + 1)} else {base})"
    if choice == 4:
        return f"({base} == {atom(rng, in_loop)})"
    if choice == 5:
        return f"({base} in {pick(rng, CONTAINERS)})"
    if choice == 6:
        return f"(count {pick(rng, ['+', '-', '*', '//', '%', '/'])} {pick(rng, ['2', 'count', '0.5', 'loop.index' if in_loop else '1'])})"
    return base


def condition(rng, in_loop, depth=0):
    options = [
        "flag", "not flag", "count > 2", "empty", "nothing is none", "missing is defined", "messages|length > 1",
        f"{atom(rng, in_loop)} is defined", f"{atom(rng, in_loop)} and flag", f"{atom(rng, in_loop)} or empty",
        "'x' in messages[1].content", "messages[0].role == 'system'",
    ]
    if in_loop:
        options += ["loop.first", "loop.last", "loop.index is even", "item"]
    return pick(rng, options)


def tag(rng, body):
    return "{%" + pick(rng, START) + " " + body + " " + pick(rng, END_BLOCK) + "%}"


def block(rng, depth, in_loop):
    parts = []
    for _ in range(rng.randrange(1, 5)):
        kind = rng.randrange(10 if depth < 3 else 5)
        parts.append(pick(rng, TEXTS))
        if kind in (0, 1, 2):
            parts.append("{{" + pick(rng, START[:2]) + " " + expression(rng, in_loop) + " " + pick(rng, END_VARIABLE) + "}}")
        elif kind == 3:
            parts.append("{#" + pick(rng, START) + " note " + pick(rng, END_BLOCK) + "#}")
        elif kind == 4:
            parts.append(tag(rng, f"set v{rng.randrange(3)} = {expression(rng, in_loop)}"))
            parts.append("{{ v0 ~ v1 ~ v2 }}")
        elif kind in (5, 6):
            parts.append(tag(rng, "if " + condition(rng, in_loop)))
            parts.append(block(rng, depth + 1, in_loop))
            if rng.randrange(2):
                parts.append(tag(rng, "elif " + condition(rng, in_loop)))
                parts.append(block(rng, depth + 1, in_loop))
            if rng.randrange(2):
                parts.append(tag(rng, "else"))
                parts.append(block(rng, depth + 1, in_loop))
            parts.append(tag(rng, "endif"))
        elif kind in (7, 8):
            iterable = pick(rng, ["messages", "range(count)", "[1, 'a', none]", "'ab'", "messages|map(attribute='role')", "{'k': 1, 'j': 2}", "missing"])
            filter_clause = pick(rng, ["", " if item", " if loop is undefined"])
            parts.append(tag(rng, f"for item in {iterable}{filter_clause}"))
            parts.append(block(rng, depth + 1, True))
            if rng.randrange(3) == 0:
                parts.append(tag(rng, "else"))
                parts.append(block(rng, depth + 1, in_loop))
            parts.append(tag(rng, "endfor"))
        else:
            parts.append(tag(rng, "macro mac(a, b='dflt')"))
            parts.append(block(rng, depth + 1, False).replace("{{ v0 ~ v1 ~ v2 }}", "{{ a ~ b }}"))
            parts.append(tag(rng, "endmacro"))
            parts.append("{{ mac(" + expression(rng, in_loop) + ") }}")
    parts.append(pick(rng, TEXTS))
    return "".join(parts)


def main():
    rng = random.Random(SEED)
    records = []
    for _ in range(COUNT):
        template = block(rng, 0, False) + pick(rng, ["", "\n", "\n\n"])
        record = {"template": template}
        try:
            record["expected"] = _compile_jinja_template(template).render(**VARIABLES)
        except Exception as error:  # the oracle records every failure, whatever its type
            record["error"] = f"{type(error).__name__}: {error}"
        records.append(record)
    fixture = {
        "generator": "tools/oracle/chat_template_random_templates.py",
        "seed": SEED,
        "jinja2": jinja2.__version__,
        "variables": VARIABLES,
        "templates": records,
    }
    write_fixture("random_templates.json", fixture, records, "templates")


if __name__ == "__main__":
    main()
