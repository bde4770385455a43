"""Every error of the API as the openai SDK's exception type, and hostile input: each a clear 4xx in OpenAI's
error shape, after which the server keeps serving."""
import socket
import subprocess
import threading

import httpx
import openai
import pytest

from conftest import QSPEC, Server


def error_of(response, status):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize("field,value,message", [
    ("temperature", "hot", "temperature: expected a number"),
    ("temperature", -1, "temperature: expected a number >= 0"),
    ("top_p", 0, "top_p: expected a number in (0, 1]"),
    ("max_tokens", -1, "max_tokens: expected an integer in [1,"),
    ("max_tokens", 0, "max_tokens: expected an integer in [1,"),
    ("max_tokens", "many", "max_tokens: expected an integer"),
    ("seed", -3, "seed: expected an integer >= 0"),
    ("stop", 3, "stop: expected a string or a list of strings"),
    ("stop", [""], "stop: a stop string must not be empty"),
    ("stream", "yes", "stream: expected a boolean"),
    ("n", 2, "n: n other than 1"),
    ("logprobs", 1, "logprobs: logprobs is not supported"),
    ("echo", True, "echo: echo is not supported"),
    ("presence_penalty", 0.5, "presence_penalty"),
    ("prompt", 5, "prompt: expected a string or a list of token ids"),
    ("prompt", ["a", "b"], "prompt: a list of several prompts is not supported"),
    ("prompt", [], "prompt: expected at least one token"),
    ("prompt", [1, -2], "prompt[1]: expected an integer in [0,"),
    ("prompt", [1, 10**9], "prompt: token id 1000000000 outside the vocabulary"),
])
def test_bad_completion_fields_are_400_naming_the_field(server, client, field, value, message):
    body = {"model": "tiny", "prompt": "Hi", "max_tokens": 2, field: value}
    error = error_of(httpx.post(server.url + "/v1/completions", json=body), 400)
    assert error["message"].startswith(message), error
    assert error["param"] == field.split("[")[0] or error["param"].startswith(field)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(**body)


@pytest.mark.parametrize("field,value,message", [
    ("messages", "hello", "messages: expected a non-empty list"),
    ("messages", [], "messages: expected a non-empty list"),
    ("messages", [{"content": "x"}], "messages[0].role: required"),
    ("messages", [{"role": "wizard", "content": "x"}], "messages[0].role: expected system"),
    ("messages", [{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content[0].type"),
    ("tools", [{"type": "function", "function": {"name": "f"}}], "tools: tools (tool calling) is not supported"),
    ("response_format", {"type": "json_object"}, "response_format"),
    ("chat_template_kwargs", {"enable_thinking": "no"}, "chat_template_kwargs.enable_thinking: expected a boolean"),
    ("stream_options", {"include_usage": True}, "stream_options: only allowed with stream: true"),
])
def test_bad_chat_fields_are_400_naming_the_field(server, field, value, message):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, field: value}
    error = error_of(httpx.post(server.url + "/v1/chat/completions", json=body), 400)
    assert error["message"].startswith(message), error


def test_context_overflow_names_both_numbers(server, client):
    limit = httpx.get(server.url + "/v1/models").json()["data"][0]["max_model_len"]
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model="tiny", prompt="Hello there", max_tokens=limit)
    message = raised.value.body["message"]
    assert f"maximum context length is {limit} tokens" in message
    assert f"in the prompt, {limit} in the completion" in message
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="Hi", max_tokens=10**12)


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as raised:
        client.completions.create(model="gpt-5", prompt="Hi", max_tokens=2)
    assert "gpt-5" in raised.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)


def test_unknown_route_is_404_in_openai_shape(server):
    assert error_of(httpx.get(server.url + "/v1/nothing"), 404)["type"] == "not_found_error"


def test_api_key(tiny_model):
    server = Server(tiny_model, "--api-key", "sekret", "--quiet")
    try:
        for key in ["wrong", "sekret-but-longer", ""]:
            with pytest.raises(openai.AuthenticationError):
                server.client(api_key=key).completions.create(model=str(tiny_model), prompt="Hi", max_tokens=1)
        assert error_of(httpx.get(server.url + "/v1/models"), 401)["type"] == "authentication_error"
        assert server.client(api_key="sekret").completions.create(prompt="Hi", max_tokens=1, model=str(tiny_model))
        assert httpx.get(server.url + "/health").status_code == 200  # probes need no key
        assert httpx.get(server.url + "/metrics").status_code == 200
    finally:
        assert server.stop() == 0


def test_full_queue_is_429(tiny_model):
    server = Server(tiny_model, "--max-queue", "1", "--quiet")
    results = []
    try:
        def one():
            try:
                server.client().completions.create(model=str(tiny_model), prompt="Hi", max_tokens=40, temperature=0,
                                                   extra_body={"ignore_eos": True})
                results.append("ok")
            except openai.RateLimitError as error:
                assert error.response.headers["retry-after"] == "1"
                results.append(429)
        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results.count(429) >= 1 and results.count("ok") >= 2, results
        assert len(results) == 6
    finally:
        assert server.stop() == 0


def raw_request(url, data, headers=b""):
    """Bytes as they are (no client-side JSON checks): the status line and body of the answer."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + headers +
                           b"Content-Length: " + str(len(data)).encode() + b"\r\nConnection: close\r\n\r\n" + data)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


def test_hostile_input_gets_a_clear_4xx_and_the_server_keeps_serving(server, client):
    ten_mb = b'{"prompt": "' + b"a" * (10 << 20) + b'", "max_tokens": 1}'
    answer = httpx.post(server.url + "/v1/completions", content=ten_mb, headers={"Content-Type": "application/json"})
    assert "larger than 8388608 bytes" in error_of(answer, 413)["message"]
    deep = b'{"prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    assert "nested deeper than 64" in error_of(httpx.post(server.url + "/v1/completions", content=deep), 400)["message"]
    invalid_utf8 = b'{"prompt": "caf\xc3(", "max_tokens": 1}'
    assert "malformed JSON" in error_of(httpx.post(server.url + "/v1/completions", content=invalid_utf8), 400)["message"]
    for body in [b"", b"{", b"[1, 2]", b"null", b'{"prompt": "a", "max_tokens": 1}}']:
        assert error_of(httpx.post(server.url + "/v1/completions", content=body), 400)["message"].startswith("request body")
    assert b"HTTP/1.1 400" in raw_request(server.url, b'{"prompt": "\xff\xfe", "max_tokens": 1}')
    messages = [{"role": "user", "content": "x"}]
    for field, value in [("max_tokens", 2**63), ("max_tokens", 1.5), ("top_k", "all"), ("seed", 1.5)]:
        body = {"messages": messages, field: value}
        assert error_of(httpx.post(server.url + "/v1/chat/completions", json=body), 400)["param"] == field
    # Still serving, and nothing was left running.
    assert client.completions.create(model="tiny", prompt="Hi", max_tokens=2).usage.completion_tokens == 2
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.mark.parametrize("option,value", [("--prefill-chunk", "0"), ("--max-model-len", "-5")])
def test_bad_server_options_exit_naming_the_option(tiny_model, option, value):
    run = subprocess.run([QSPEC, "serve", "--model", str(tiny_model), "--port", "0", option, value],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode != 0
    assert option in run.stderr
