"""Where and how the chat-template oracle scripts write their fixtures.

Each fixture is tests/fixtures/chat_template/NAME, JSON indented by one space in UTF-8; writing it prints a line
on stderr that counts its records and those that raise.
"""

import json
import pathlib
import sys

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "chat_template"


def write_fixture(name, fixture, records, noun):
    """Writes `fixture` as FIXTURES / name; `records` (each a dict, "error" in those that raise) are its `noun`."""
    out = FIXTURES / name
    out.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(records)} {noun} ({sum('error' in r for r in records)} raising) -> {out}", file=sys.stderr)
