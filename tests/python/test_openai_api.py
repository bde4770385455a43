"""The server through the official openai SDK: completions and chat, streamed and not, usage, stop strings,
seeds, reasoning, and outputs equal to `qspec generate` for the same request."""
import json
import time

import httpx
import pytest

from conftest import IDS_ONLY_MODEL, Server, generate


def complete(client, prompt, **kwargs):
    return client.completions.create(model="tiny", prompt=prompt, **kwargs)


def streamed_completion(client, prompt, **kwargs):
    chunks = list(client.completions.create(model="tiny", prompt=prompt, stream=True,
                                            stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    return text, finish, chunks[-1].usage


def test_completion_equals_qspec_generate(client, tiny_model):
    reference = generate(tiny_model, "--prompt", "The quick brown fox", "-n", "12", "--temperature", "0")
    response = complete(client, "The quick brown fox", max_tokens=12, temperature=0,
                        extra_body={"return_token_ids": True})
    choice = response.choices[0]
    assert choice.text == reference["text"]
    assert choice.token_ids == reference["tokens"]
    assert choice.finish_reason == reference["finish_reason"] == "length"
    assert response.usage.prompt_tokens == reference["prompt_tokens"]
    assert response.usage.completion_tokens == 12
    assert response.usage.total_tokens == reference["prompt_tokens"] + 12
    assert response.id.startswith("cmpl-") and response.model == "tiny" and response.object == "text_completion"


def test_prefill_chunk_gives_the_same_completion(tiny_model):
    """--prefill-chunk 2 prefills the prompt two tokens a forward pass: the same greedy tokens as one pass."""
    reference = generate(tiny_model, "--prompt", "The quick brown fox jumps", "-n", "10", "--temperature", "0")
    server = Server(tiny_model, "--prefill-chunk", "2", "--served-model-name", "tiny", "--quiet")
    try:
        response = server.client().completions.create(model="tiny", prompt="The quick brown fox jumps",
                                                      max_tokens=10, temperature=0,
                                                      extra_body={"return_token_ids": True})
        assert response.choices[0].token_ids == reference["tokens"]
        assert response.usage.prompt_tokens == reference["prompt_tokens"] > 2
    finally:
        assert server.stop() == 0


def test_sampled_completion_equals_qspec_generate_with_the_same_seed(client, tiny_model):
    reference = generate(tiny_model, "--prompt", "Once upon a time", "-n", "10", "--temperature", "0.9",
                         "--top-k", "50", "--top-p", "0.95", "--seed", "1234")
    response = complete(client, "Once upon a time", max_tokens=10, temperature=0.9, top_p=0.95, seed=1234,
                        extra_body={"top_k": 50, "return_token_ids": True})
    assert response.choices[0].token_ids == reference["tokens"]
    assert response.choices[0].text == reference["text"]


def test_seed_reproducibility(client):
    def sample(seed):
        return complete(client, "Hello", max_tokens=16, temperature=1.0, seed=seed).choices[0].text
    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def test_token_id_prompt_on_a_model_without_tokenizer_equals_generate():
    server = Server(IDS_ONLY_MODEL)
    try:
        reference = generate(IDS_ONLY_MODEL, "--prompt-ids", "1,2,3,4", "-n", "6", "--temperature", "0")
        response = server.client().completions.create(model=str(IDS_ONLY_MODEL), prompt=[1, 2, 3, 4], max_tokens=6,
                                                      temperature=0, extra_body={"return_token_ids": True})
        assert response.choices[0].token_ids == reference["tokens"]
        assert response.usage.prompt_tokens == 4
        # Text needs a tokenizer: a clear 400, not an empty answer.
        error = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).json()["error"]
        assert error["param"] == "prompt" and "no tokenizer" in error["message"]
    finally:
        assert server.stop() == 0


def test_streamed_completion_equals_non_streamed(client):
    full = complete(client, "In the beginning", max_tokens=12, temperature=0)
    text, finish, usage = streamed_completion(client, "In the beginning", max_tokens=12, temperature=0)
    assert text == full.choices[0].text
    assert finish == ["length"]
    assert usage.completion_tokens == full.usage.completion_tokens == 12
    assert usage.prompt_tokens == full.usage.prompt_tokens


def chat(client, content, **kwargs):
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}], **kwargs)


def reasoning_and_answer(text):
    """vLLM's qwen3 split of a reply that started inside <think>."""
    if "</think>" not in text:
        return text, None
    reasoning, answer = text.split("</think>", 1)
    return reasoning, answer.lstrip("\n") or None


@pytest.mark.parametrize("thinking", [True, False])
def test_chat_equals_qspec_generate_and_splits_reasoning(client, tiny_model, tmp_path, thinking):
    messages = [{"role": "user", "content": "Hi there"}]
    (tmp_path / "m.json").write_text(json.dumps(messages))
    flags = [] if thinking else ["--no-thinking"]
    reference = generate(tiny_model, "--chat", str(tmp_path / "m.json"), "-n", "10", "--temperature", "0", *flags)
    response = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": thinking}, "return_token_ids": True})
    message = response.choices[0].message
    assert response.choices[0].token_ids == reference["tokens"]
    if thinking:
        reasoning, answer = reasoning_and_answer(reference["text"])
        assert message.reasoning_content == reasoning
        assert message.content == answer
    else:
        assert message.reasoning_content is None
        assert message.content == reference["text"].lstrip("\n")
    assert response.usage.prompt_tokens == reference["prompt_tokens"]
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")


@pytest.mark.parametrize("thinking", [True, False])
def test_streamed_chat_equals_non_streamed(client, thinking):
    kwargs = dict(max_tokens=12, temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})
    full = chat(client, "Tell me a story", **kwargs).choices[0]
    chunks = list(chat(client, "Tell me a story", stream=True, stream_options={"include_usage": True}, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    content = "".join(d.content or "" for d in deltas)
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    assert content == (full.message.content or "")
    assert reasoning == (getattr(full.message, "reasoning_content", None) or "")
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == 12


def test_stop_strings_across_token_boundaries(client, server):
    prompt = "The capital of France"
    full = complete(client, prompt, max_tokens=16, temperature=0, extra_body={"return_token_ids": True}).choices[0]
    text, ids = full.text, full.token_ids
    # A stop string made of the end of token 5's text and the start of token 6's.
    boundary = len(httpx.post(server.url + "/detokenize", json={"tokens": ids[:5]}).json()["prompt"])
    assert 2 <= boundary <= len(text) - 2, text
    stop = text[boundary - 2:boundary + 2]
    expected = text[:text.index(stop)]
    for response in [complete(client, prompt, max_tokens=16, temperature=0, stop=stop),
                     complete(client, prompt, max_tokens=16, temperature=0, stop=["\u2603never", stop])]:
        assert response.choices[0].text == expected
        assert response.choices[0].finish_reason == "stop"
    streamed, finish, _ = streamed_completion(client, prompt, max_tokens=16, temperature=0, stop=stop)
    assert streamed == expected and finish == ["stop"]
    # The start of a stop string that never completes is held back, then flushed at the end.
    unfinished = text[-3:] + "\u2603"
    streamed, finish, _ = streamed_completion(client, prompt, max_tokens=16, temperature=0, stop=unfinished)
    assert streamed == text and finish == ["length"]
    assert complete(client, prompt, max_tokens=16, temperature=0, stop=unfinished).choices[0].text == text


def test_max_completion_tokens_and_default_max_tokens(client):
    assert chat(client, "Hi", max_completion_tokens=3, temperature=0).usage.completion_tokens == 3
    # OpenAI's default for completions is 16 tokens.
    response = complete(client, "Hi", temperature=0, extra_body={"ignore_eos": True})
    assert response.usage.completion_tokens == 16


def test_models_tokenize_detokenize_ping(server):
    models = httpx.get(server.url + "/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny"]
    assert models["data"][0]["max_model_len"] > 0
    tokens = httpx.post(server.url + "/tokenize", json={"prompt": "Hello world 😀"}).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0
    text = httpx.post(server.url + "/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"]
    assert text == "Hello world 😀"
    chat_tokens = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert chat_tokens["count"] > tokens["count"] - 5
    assert httpx.get(server.url + "/ping").status_code == 200


def test_invocations_contract(client, server):
    raw = httpx.post(server.url + "/invocations", json={"prompt": "Hello", "max_tokens": 6, "temperature": 0}).json()
    assert raw["object"] == "text_completion"
    assert raw["choices"][0]["text"] == complete(client, "Hello", max_tokens=6, temperature=0).choices[0].text
    messages = [{"role": "user", "content": "Hi"}]
    answer = httpx.post(server.url + "/invocations", json={"messages": messages, "max_tokens": 6, "temperature": 0})
    assert answer.json()["object"] == "chat.completion"
    expected = chat(client, "Hi", max_tokens=6, temperature=0).choices[0].message
    assert answer.json()["choices"][0]["message"]["reasoning_content"] == expected.reasoning_content


def test_access_log_line_per_request(server, client):
    complete(client, "Hi", max_tokens=2, temperature=0, extra_headers={"X-Request-Id": "log-check-1"})
    # The line may reach the log reader after the response (and after earlier requests' lines): wait for it.
    deadline = time.monotonic() + 10
    while not (lines := [r for r in server.access_log() if r["request_id"] == "cmpl-log-check-1"]):
        assert time.monotonic() < deadline, "no access log line for cmpl-log-check-1"
        time.sleep(0.01)
    assert len(lines) == 1
    line = lines[0]
    assert line["completion_tokens"] == 2 and line["prompt_tokens"] == 1
    assert line["ttft_ms"] > 0 and line["e2e_ms"] >= line["ttft_ms"]
