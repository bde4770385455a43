"""Scheduling and lifecycle: concurrent clients, cancellation when a client leaves, SIGTERM drain, readiness
during start, and /metrics counters against the requests made."""
import concurrent.futures
import signal
import socket
import time

import httpx
import openai
import pytest

from conftest import Server, metrics

PROMPTS = ["Hello", "The weather today", "One two three", "Café au lait ☕", "def main():", "日本語のテキスト",
           "Once upon a time", "SELECT * FROM"]


def running(server):
    return metrics(server.url)[("vllm:num_requests_running", ())]


def wait_until(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.002)
    return False


def test_16_concurrent_clients_200_requests_equal_sequential_and_memory_is_stable(tiny_model):
    # 16 clients never fill the default queue of 64, so every request must be served.
    server = Server(tiny_model, "--served-model-name", "tiny", "--quiet")
    try:
        client = server.client()

        def one(i):
            prompt = PROMPTS[i % len(PROMPTS)]
            if i % 2:
                response = client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=4, temperature=0)
                return prompt, "chat", (response.choices[0].message.reasoning_content, response.choices[0].message.content)
            response = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0)
            return prompt, "completion", response.choices[0].text

        sequential = {(p, kind): out for p, kind, out in map(one, range(2 * len(PROMPTS)))}
        rss_before = server.rss_kib()

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(one, range(200)))
        assert len(results) == 200
        for prompt, kind, out in results:
            assert out == sequential[(prompt, kind)]
        # Again, to see that memory does not grow with the number of requests.
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(one, range(200)))
        growth_kib = server.rss_kib() - rss_before
        assert growth_kib < 16 * 1024, f"RSS grew by {growth_kib} KiB over 400 requests"
        gauges = metrics(server.url)
        assert gauges[("vllm:num_requests_running", ())] == 0 and gauges[("vllm:num_requests_waiting", ())] == 0
    finally:
        assert server.stop() == 0


def test_a_client_that_disconnects_mid_stream_cancels_its_generation(tiny_model):
    server = Server(tiny_model, "--served-model-name", "tiny")
    try:
        stream = server.client().completions.create(model="tiny", prompt="Hi", max_tokens=5000, temperature=0,
                                                    stream=True, extra_body={"ignore_eos": True})
        received = 0
        for chunk in stream:
            received += 1
            if received == 3:
                break
        assert running(server) == 1
        stream.close()
        left = time.monotonic()
        assert wait_until(lambda: running(server) == 0, 1.0), "generation still running 1 s after the client left"
        stopped_after = time.monotonic() - left
        assert wait_until(lambda: server.access_log(), 1.0)
        line = server.access_log()[-1]
        assert line["finish_reason"] == "abort"
        # One step of the tiny model is a few ms, so the generation stopped long before its 5000 tokens.
        assert line["completion_tokens"] < 1000, (line, stopped_after)
        assert metrics(server.url)[("vllm:request_success_total", (("finished_reason", "abort"),))] == 1
    finally:
        assert server.stop() == 0


def test_a_client_that_disconnects_while_waiting_for_a_whole_response_cancels_it(tiny_model):
    server = Server(tiny_model)
    try:
        host, port = server.url.removeprefix("http://").split(":")
        body = b'{"prompt": "Hi", "max_tokens": 5000, "ignore_eos": true, "temperature": 0}'
        with socket.create_connection((host, int(port))) as connection:
            connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                               str(len(body)).encode() + b"\r\n\r\n" + body)
            assert wait_until(lambda: running(server) == 1, 2.0)
        assert wait_until(lambda: running(server) == 0, 1.0)
        assert wait_until(lambda: server.access_log(), 1.0)
        assert server.access_log()[-1]["finish_reason"] == "abort"
    finally:
        assert server.stop() == 0


def test_sigterm_drains_then_exits_0(tiny_model):
    server = Server(tiny_model, "--served-model-name", "tiny")
    client = server.client()
    stream = client.completions.create(model="tiny", prompt="Hi", max_tokens=300, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = [next(iter(stream))]
    server.process.send_signal(signal.SIGTERM)
    assert wait_until(lambda: httpx.get(server.url + "/health").status_code == 503, 2.0)
    with pytest.raises(openai.InternalServerError) as refused:
        client.completions.create(model="tiny", prompt="Hi", max_tokens=1)
    assert refused.value.status_code == 503
    chunks += list(stream)
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]
    assert server.stop(timeout=30) == 0
    assert server.access_log()[-1]["completion_tokens"] == 300


def test_sigterm_cancels_what_outlasts_the_drain_timeout(tiny_model):
    server = Server(tiny_model, "--drain-timeout", "0.3")
    stream = server.client().completions.create(model=str(tiny_model), prompt="Hi", max_tokens=30000,
                                                temperature=0, stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    started = time.monotonic()
    assert server.stop(timeout=30) == 0
    assert time.monotonic() - started < 10
    assert server.access_log()[-1]["finish_reason"] == "abort"


def test_health_is_503_while_loading_then_200(tiny_model):
    server = Server(tiny_model, wait_ready=False)
    try:
        # The server listens before it loads the model (the tokenizer alone takes a while to read).
        first = httpx.get(server.url + "/health")
        assert first.status_code == 503 and first.json()["error"]["message"] == "loading"
        assert httpx.post(server.url + "/v1/completions", json={"prompt": "Hi"}).status_code == 503
        server.wait_ready()
        assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    finally:
        assert server.stop() == 0


def test_metrics_parse_and_count_the_requests_made(tiny_model):
    server = Server(tiny_model, "--served-model-name", "tiny", "--quiet")
    try:
        client = server.client()
        prompt_tokens = completion_tokens = 0
        for max_tokens in [1, 3, 5]:
            usage = client.completions.create(model="tiny", prompt="Hello world", max_tokens=max_tokens,
                                              temperature=0, extra_body={"ignore_eos": True}).usage
            prompt_tokens += usage.prompt_tokens
            completion_tokens += usage.completion_tokens
        usage = client.completions.create(model="tiny", prompt="Stop here", max_tokens=8, temperature=0,
                                          stop=[" "], extra_body={"ignore_eos": True}).usage
        prompt_tokens += usage.prompt_tokens
        completion_tokens += usage.completion_tokens
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="tiny", prompt="Hi", max_tokens=-1)
        samples = metrics(server.url)
        assert samples[("vllm:prompt_tokens_total", ())] == prompt_tokens
        assert samples[("vllm:generation_tokens_total", ())] == completion_tokens == 9 + usage.completion_tokens
        assert samples[("vllm:request_success_total", (("finished_reason", "length"),))] == 3
        assert samples[("vllm:request_success_total", (("finished_reason", "stop"),))] == 1
        for histogram in ["vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"]:
            assert samples[(histogram + "_count", ())] == 4
            assert samples[(histogram + "_bucket", (("le", "+Inf"),))] == 4
            assert samples[(histogram + "_sum", ())] > 0
        assert samples[("vllm:num_requests_running", ())] == 0
        assert samples[("vllm:num_requests_waiting", ())] == 0
        assert samples[("vllm:kv_cache_usage_perc", ())] == 0
        assert samples[("vllm:spec_decode_num_draft_tokens_total", ())] == 0
        assert samples[("vllm:spec_decode_num_accepted_tokens_total", ())] == 0
        assert samples[("qspec:http_responses_total", (("status", "400"),))] == 1
        # The four completions and the /health probe that found the server ready.
        assert samples[("qspec:http_responses_total", (("status", "200"),))] == 5
    finally:
        assert server.stop() == 0
