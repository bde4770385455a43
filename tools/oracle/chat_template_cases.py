#!/usr/bin/env python3
"""Chat-template oracle: renders conversations with HF's own chat-template code and records the results.

Writes tests/fixtures/chat_template/cases.json: for every case the template file, the messages, tools and
template variables, and either the exact rendered text or the message of the error the template raises.
tests/test_chat_template_cases.cpp renders the same cases with qspec's Jinja interpreter and compares.

Rendering is transformers.utils.chat_template_utils.render_jinja_template (what apply_chat_template calls:
jinja2 ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loopcontrols), tojson as
json.dumps(ensure_ascii=False), raise_exception, strftime_now). Without transformers the same environment is
built here from jinja2 alone.

    /work/oracle-venv/bin/python tools/oracle/chat_template_cases.py
"""

import json

import jinja2

from chat_template_fixture import FIXTURES, write_fixture


try:
    import transformers
    from transformers.utils.chat_template_utils import render_jinja_template

    RENDERER = f"transformers {transformers.__version__} render_jinja_template"

    def render(template, messages, tools, add_generation_prompt, variables):
        text, _ = render_jinja_template(
            conversations=[messages],
            tools=tools,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
        return text[0]

except ImportError:
    import jinja2.ext
    import jinja2.sandbox
    from datetime import datetime

    RENDERER = "jinja2 environment as in transformers' chat_template_utils"

    def _raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def render(template, messages, tools, add_generation_prompt, variables):
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return env.from_string(template).render(
            messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **variables
        )


QWEN_TOKENS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
LLAMA_TOKENS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather — in °C or °F",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "max_results": {"type": "integer", "default": 5}},
            "required": ["query"],
        },
    },
}


def user(content):
    return {"role": "user", "content": content}


def assistant(content, **extra):
    return {"role": "assistant", "content": content, **extra}


def system(content):
    return {"role": "system", "content": content}


def tool(content, **extra):
    return {"role": "tool", "content": content, **extra}


def call(name, arguments, wrapped=True, call_id=None):
    body = {"name": name, "arguments": arguments}
    entry = {"type": "function", "function": body} if wrapped else body
    if call_id:
        entry["id"] = call_id
    return entry


WEATHER_CHAIN = [
    user("What's the weather in Paris and Tokyo?"),
    assistant(
        "",
        reasoning_content="I should call the weather tool twice.",
        tool_calls=[
            call("get_weather", {"location": "Paris", "unit": "celsius"}),
            call("get_weather", {"location": "Tokyo"}),
        ],
    ),
    tool('{"temperature": 18, "condition": "cloudy"}'),
    tool('{"temperature": 24, "condition": "sunny"}'),
]


def qwen35_cases():
    t = "qwen3_5.jinja"
    hello = [user("Hello, how are you?")]
    multi = [
        system("You are a concise assistant."),
        user("What is 2+2?"),
        assistant("4"),
        user("And 3+3?"),
    ]
    return [
        (t, "single_turn_default_thinking", hello, None, True, {}),
        (t, "single_turn_thinking_off", hello, None, True, {"enable_thinking": False}),
        (t, "single_turn_thinking_on", hello, None, True, {"enable_thinking": True}),
        (t, "no_generation_prompt", hello, None, False, {}),
        (t, "system_and_user", [system("You are helpful."), user("Hi")], None, True, {}),
        (t, "multi_turn", multi, None, True, {}),
        (t, "multi_turn_thinking_off", multi, None, True, {"enable_thinking": False}),
        (
            t,
            "reasoning_content_before_last_query_dropped",
            [user("Q1"), assistant("A1", reasoning_content="thinking about Q1"), user("Q2")],
            None,
            True,
            {},
        ),
        (
            t,
            "think_tags_in_assistant_content",
            [user("Q1"), assistant("<think>\nhidden reasoning\n</think>\n\nvisible answer"), user("Q2")],
            None,
            True,
            {},
        ),
        (
            t,
            "final_assistant_turn_keeps_reasoning",
            [user("Q"), assistant("<think>\nstep 1\nstep 2\n</think>\n\nThe answer is 42.")],
            None,
            False,
            {},
        ),
        (t, "tools_defined", [user("Weather in Paris?")], [WEATHER_TOOL, SEARCH_TOOL], True, {}),
        (t, "tools_with_system", [system("  Be brief.  "), user("Weather?")], [WEATHER_TOOL], True, {}),
        (t, "tools_with_empty_system", [system("   "), user("Weather?")], [WEATHER_TOOL], True, {}),
        (t, "tool_calls_chain", WEATHER_CHAIN, [WEATHER_TOOL], True, {}),
        (
            t,
            "tool_calls_chain_finished",
            WEATHER_CHAIN + [assistant("Paris: 18°C, cloudy. Tokyo: 24°C, sunny ☀️")],
            [WEATHER_TOOL],
            False,
            {},
        ),
        (
            t,
            "tool_call_with_content_and_nested_arguments",
            [
                user("Search"),
                assistant(
                    "Let me search.",
                    tool_calls=[
                        call(
                            "search",
                            {
                                "query": "qspec \"inference\"",
                                "max_results": 3,
                                "filters": {"lang": ["en", "fr"], "safe": True},
                                "tags": ["a", 1, None, 2.5],
                                "verbose": False,
                                "nothing": None,
                            },
                        )
                    ],
                ),
                tool("[]"),
            ],
            [SEARCH_TOOL],
            True,
            {},
        ),
        (
            t,
            "tool_call_without_function_wrapper",
            [user("Search"), assistant(None, tool_calls=[call("search", {"query": "x"}, wrapped=False)])],
            [SEARCH_TOOL],
            False,
            {},
        ),
        (
            t,
            "tool_call_arguments_as_string_fails",
            [user("Weather"), assistant("", tool_calls=[call("get_weather", '{"location": "Paris"}')])],
            [WEATHER_TOOL],
            True,
            {},
        ),
        (
            t,
            "tool_response_user_message_is_not_a_query",
            [user("Q"), assistant("calling"), user("<tool_response>\n42\n</tool_response>")],
            None,
            True,
            {},
        ),
        (t, "no_user_query", [system("sys"), assistant("hi")], None, True, {}),
        (t, "no_messages", [], None, True, {}),
        (t, "system_not_first", [user("a"), system("late system")], None, True, {}),
        (t, "unexpected_role", [user("a"), {"role": "narrator", "content": "x"}], None, True, {}),
        (
            t,
            "unicode_and_emoji",
            [system("Réponds en français 🇫🇷"), user("Ça va? 你好 👋🏽 \u200b zero-width, tab\tend"), assistant("Très bien! 😀")],
            None,
            True,
            {},
        ),
        (
            t,
            "content_as_text_parts",
            [
                {"role": "system", "content": [{"type": "text", "text": "System part."}]},
                {"role": "user", "content": [{"type": "text", "text": "Part one. "}, {"type": "text", "text": "Part two."}]},
            ],
            None,
            True,
            {},
        ),
        (
            t,
            "content_with_images_and_vision_ids",
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "image": "a.png"},
                        {"type": "text", "text": "Compare with"},
                        {"type": "image_url", "image_url": {"url": "b.png"}},
                        {"type": "video", "video": "c.mp4"},
                    ],
                }
            ],
            None,
            True,
            {"add_vision_id": True},
        ),
        (
            t,
            "image_in_system_fails",
            [{"role": "system", "content": [{"type": "image", "image": "a.png"}]}, user("x")],
            None,
            True,
            {},
        ),
        (t, "unexpected_content_item_fails", [{"role": "user", "content": [{"type": "audio"}]}], None, True, {}),
        (t, "unexpected_content_type_fails", [{"role": "user", "content": 42}], None, True, {}),
        (
            t,
            "whitespace_is_trimmed",
            [user("\n\n  padded question \n\n"), assistant("  padded answer  "), user("again")],
            None,
            True,
            {},
        ),
        (
            t,
            "multi_step_tool_loop_with_reasoning",
            WEATHER_CHAIN
            + [
                assistant(
                    "<think>\nNeed a search too.\n</think>\n\n",
                    tool_calls=[call("search", {"query": "Paris events"})],
                ),
                tool("No events."),
            ],
            [WEATHER_TOOL, SEARCH_TOOL],
            True,
            {"enable_thinking": True},
        ),
    ]


def qwen3_cases():
    t = "qwen3.jinja"
    return [
        (t, "qwen3_basic", [user("Hello")], None, True, {}),
        (t, "qwen3_thinking_off", [system("sys"), user("Hello")], None, True, {"enable_thinking": False}),
        (t, "qwen3_tools_and_string_arguments", WEATHER_CHAIN[:1] + [assistant("", tool_calls=[call("get_weather", '{"location": "Paris"}')]), tool("18C")], [WEATHER_TOOL], True, {}),
        (t, "qwen3_tool_chain", WEATHER_CHAIN + [assistant("<think>\ndone\n</think>\n\nIt is 18C and 24C.")], [WEATHER_TOOL], False, {}),
        (t, "qwen3_reasoning_history", [user("a"), assistant("b", reasoning_content="r"), user("c"), assistant("<think>x</think>d")], None, False, {}),
    ]


def llama_cases():
    t = "llama3_3.jinja"
    date = {"date_string": "29 Nov 2026"}
    return [
        (t, "llama_basic", [user("Hello")], None, True, date),
        (t, "llama_default_date", [system("  You are a pirate.  "), user("Hi"), assistant("Arr"), user("Bye")], None, True, {}),
        (t, "llama_tools_in_user_message", [system("sys"), user("Weather in Paris?")], [WEATHER_TOOL], True, date),
        (t, "llama_tools_in_system", [user("Weather in Paris?")], [WEATHER_TOOL, SEARCH_TOOL], True, {**date, "tools_in_user_message": False}),
        (
            t,
            "llama_tool_call_and_results",
            [user("Weather?"), assistant(None, tool_calls=[call("get_weather", {"location": "Paris"})]), tool({"temperature": 18}), tool("plain text result")],
            [WEATHER_TOOL],
            True,
            date,
        ),
        (
            t,
            "llama_builtin_tools",
            [user("Search it"), assistant(None, tool_calls=[call("brave_search", {"query": "x y"})]), {"role": "ipython", "content": "result"}],
            None,
            True,
            {**date, "builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]},
        ),
        (
            t,
            "llama_two_tool_calls_fail",
            [user("Weather?"), assistant(None, tool_calls=[call("get_weather", {"location": "A"}), call("get_weather", {"location": "B"})])],
            [WEATHER_TOOL],
            True,
            date,
        ),
        (t, "llama_tools_without_user_message_fail", [system("only system")], [WEATHER_TOOL], True, date),
    ]


TYPED_TOOL = {
    "type": "function",
    "function": {
        "name": "plot",
        "description": "  Plot series.  ",
        "parameters": {
            "type": "object",
            "properties": {
                "points": {"type": "array", "items": {"type": "number"}, "description": "y values"},
                "style": {"type": "object", "additionalProperties": {"type": "string"}, "description": "CSS-like"},
                "title": {"type": ["string", "integer"], "description": "title or index"},
                "log": {"type": "boolean", "description": "log scale"},
                "extra": {"description": "anything"},
                "count": {"type": "integer", "description": "how many"},
            },
            "required": ["points"],
        },
        "return": {"type": "string", "description": "a PNG path"},
    },
}


NULLABLE_TOOL = {
    "type": "function",
    "function": {
        "name": "f",
        "description": "d",
        "parameters": {"type": "object", "properties": {"x": {"type": ["string", "null"], "description": "x"}}},
    },
}


def hermes_cases():
    t = "hermes3_tool_use.jinja"
    tokens = {"bos_token": "<|begin_of_text|>"}
    chat = [
        system("You are Hermes."),
        user("Plot 1 2 3"),
        assistant(None, tool_calls=[call("plot", {"points": [1, 2, 3], "log": False}), call("plot", '{"points": [4]}')]),
        tool("/tmp/a.png"),
        tool("/tmp/b.png"),
        assistant("Done: two plots."),
        user("Thanks"),
    ]
    return [
        (t, "hermes_typed_tools", [user("hi")], [TYPED_TOOL, WEATHER_TOOL], True, tokens),
        (t, "hermes_tool_calls_and_responses", chat, [TYPED_TOOL], True, tokens),
        (t, "hermes_no_tools", [user("hi")], None, False, tokens),
        # The template recurses without end on a type it cannot name ("null" iterates as a string).
        (t, "hermes_runaway_recursion_fails", [user("hi")], [NULLABLE_TOOL], True, tokens),
    ]


def main():
    templates = {}
    cases = []
    all_cases = qwen35_cases() + qwen3_cases() + llama_cases() + hermes_cases()
    for template_file, name, messages, tools, add_generation_prompt, kwargs in all_cases:
        if template_file not in templates:
            templates[template_file] = (FIXTURES / template_file).read_text(encoding="utf-8")
        special = LLAMA_TOKENS if template_file.startswith("llama") else QWEN_TOKENS if "qwen" in template_file else {}
        variables = {**special, **kwargs}
        case = {
            "name": name,
            "template": template_file,
            "messages": messages,
            "tools": tools,
            "add_generation_prompt": add_generation_prompt,
            "variables": variables,
        }
        try:
            case["expected"] = render(templates[template_file], messages, tools, add_generation_prompt, variables)
        except jinja2.exceptions.TemplateError as error:
            case["error"] = str(error)
        except TypeError as error:
            case["error"] = str(error)
        except RecursionError as error:
            # Python's wording is its own; qspec stops at its macro depth limit instead.
            case["error"] = str(error)
            case["error_any"] = True
        cases.append(case)
    fixture = {
        "generator": "tools/oracle/chat_template_cases.py",
        "renderer": RENDERER,
        "jinja2": jinja2.__version__,
        "cases": cases,
    }
    write_fixture("cases.json", fixture, cases, "cases")


if __name__ == "__main__":
    main()
