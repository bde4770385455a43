"""`qspec serve --draft-model`: speculative decoding with a random DFlash drafter for the tiny target
(`qspec synth --arch dflash-qwen3.5-tiny`). Greedy outputs equal the server's without the drafter, sampled ones
equal `qspec generate --draft-model` with the same seed, streaming works, and the spec-decode counters count
every verified draft. A random drafter's drafts are rarely accepted: accepted counts are checked against the
access log and the drafts, the counts themselves by the C++ tests with oracle drafts."""
import subprocess

import pytest

from conftest import QSPEC, Server, generate, metrics

SPEC_TOKENS = 7
DRAFT_WINDOW = 12  # below prompt + completion: the window applies


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "tiny-drafter"
    subprocess.run([QSPEC, "synth", "--arch", "dflash-qwen3.5-tiny", "--out", str(out)], check=True,
                   capture_output=True)
    return out


@pytest.fixture(scope="module")
def spec_server(tiny_model, drafter):
    running = Server(tiny_model, "--served-model-name", "tiny", "--draft-model", str(drafter),
                     "--spec-tokens", str(SPEC_TOKENS), "--draft-window", str(DRAFT_WINDOW))
    yield running
    assert running.stop() == 0


def token_ids(client, **kwargs):
    response = client.completions.create(model="tiny", extra_body={"return_token_ids": True}, **kwargs)
    return response.choices[0].token_ids, response.choices[0].finish_reason


def counters(url):
    samples = metrics(url)
    return (samples[("vllm:spec_decode_num_draft_tokens_total", ())],
            samples[("vllm:spec_decode_num_accepted_tokens_total", ())])


def test_the_ready_line_names_the_drafter(spec_server, drafter):
    assert any("ready" in line and f"drafter {drafter}" in line for line in spec_server.log)


@pytest.mark.parametrize("prompt", ["The quick brown fox", "Hello", [1, 2, 3, 4, 5, 6, 7, 8, 9]])
def test_greedy_completions_equal_the_server_without_drafter(server, spec_server, prompt):
    request = dict(prompt=prompt, max_tokens=20, temperature=0)
    assert token_ids(spec_server.client(), **request) == token_ids(server.client(), **request)


def test_greedy_chat_equals_the_server_without_drafter(server, spec_server):
    def reply(s):
        response = s.client().chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Name three colors."}], max_tokens=16,
            temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        return response.choices[0].message.content, response.usage.completion_tokens
    assert reply(spec_server) == reply(server)


def test_max_tokens_and_stop_strings_are_honoured(server, spec_server):
    # max_tokens not a multiple of the step: the last step is cut short.
    for max_tokens in (1, SPEC_TOKENS + 2):
        ids, finish = token_ids(spec_server.client(), prompt="Once upon a time", max_tokens=max_tokens, temperature=0)
        assert len(ids) == max_tokens and finish == "length"
    plain = server.client().completions.create(model="tiny", prompt="Once upon a time", max_tokens=20,
                                               temperature=0).choices[0].text
    stop = plain[len(plain) // 2:len(plain) // 2 + 3]
    with_stop = spec_server.client().completions.create(model="tiny", prompt="Once upon a time", max_tokens=20,
                                                        temperature=0, stop=[stop])
    assert with_stop.choices[0].text == plain[:plain.index(stop)]
    assert with_stop.choices[0].finish_reason == "stop"


def test_streamed_text_equals_the_whole_response(spec_server):
    client = spec_server.client()
    whole = client.completions.create(model="tiny", prompt="The weather today", max_tokens=24, temperature=0)
    chunks = list(client.completions.create(model="tiny", prompt="The weather today", max_tokens=24, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 24


def test_sampled_completion_equals_qspec_generate_with_the_drafter(tiny_model, drafter, spec_server):
    reference = generate(tiny_model, "--draft-model", str(drafter), "--spec-tokens", str(SPEC_TOKENS),
                         "--draft-window", str(DRAFT_WINDOW), "--prompt", "Once upon a time", "-n", "12",
                         "--temperature", "0.9", "--top-k", "50", "--seed", "77")
    response = spec_server.client().completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=12, temperature=0.9, seed=77,
        extra_body={"top_k": 50, "return_token_ids": True})
    assert response.choices[0].token_ids == reference["tokens"]
    assert reference["draft_tokens"] > 0


def test_spec_decode_counters_count_every_verified_draft(spec_server):
    drafted_before, accepted_before = counters(spec_server.url)
    requests_before = len(spec_server.access_log())
    for max_tokens in (5, 17):
        spec_server.client().completions.create(model="tiny", prompt="Counting drafts", max_tokens=max_tokens,
                                                temperature=0)
    drafted, accepted = counters(spec_server.url)
    records = spec_server.access_log()[requests_before:]
    assert len(records) == 2
    # Each step verifies min(K, tokens still wanted) drafts and emits at least one token.
    for record, max_tokens in zip(records, (5, 17)):
        assert 0 < record["draft_tokens"] <= SPEC_TOKENS * (max_tokens - 1)
        assert 0 <= record["accepted_tokens"] <= record["draft_tokens"]
    assert drafted - drafted_before == sum(r["draft_tokens"] for r in records) > 0
    assert accepted - accepted_before == sum(r["accepted_tokens"] for r in records)
    assert accepted <= drafted


def test_plain_decoding_counts_no_drafts(server):
    server.client().completions.create(model="tiny", prompt="Hello", max_tokens=4, temperature=0)
    assert counters(server.url) == (0, 0)


@pytest.mark.parametrize("args, message", [
    (["--spec-tokens", "3"], "--spec-tokens and --draft-window need --draft-model"),
    (["--draft-window", "8"], "--spec-tokens and --draft-window need --draft-model"),
    (["--draft-model", "DRAFTER", "--spec-tokens", "16"], "--spec-tokens: 16 drafts do not fit the drafter's block of 16"),
    (["--draft-model", "TINY"], "expected [\"DFlashDraftModel\"] (a DFlash drafter)"),
])
def test_bad_speculative_options_fail_at_load_naming_the_option(tiny_model, drafter, args, message):
    args = [str(drafter) if a == "DRAFTER" else str(tiny_model) if a == "TINY" else a for a in args]
    run = subprocess.run([QSPEC, "serve", "--model", str(tiny_model), "--port", "0", *args], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode != 0
    assert message in run.stderr
