"""Fixtures of the server tests: the qspec binary, a tiny random Qwen3.5 with the real tokenizer (made by
`qspec synth` into a temporary directory), a fixture checkpoint without a tokenizer, and `qspec serve`
processes on loopback ports."""
import json
import os
import pathlib
import re
import signal
import subprocess
import threading
import time

import httpx
import openai
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
QSPEC = os.environ.get("QSPEC_BINARY", str(ROOT / "build" / "qspec"))
TOKENIZER_DIR = ROOT / "models" / "qwen3.5-tokenizer"
IDS_ONLY_MODEL = ROOT / "tests" / "fixtures" / "qwen35" / "causal-tied-bf16"


class Server:
    """One `qspec serve` process; its stderr (progress and access log) is collected in `log`."""

    def __init__(self, model, *args, wait_ready=True):
        self.process = subprocess.Popen(
            [QSPEC, "serve", "--model", str(model), "--port", "0", *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = []
        self._listening = threading.Event()
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        if not self._listening.wait(30):
            self.process.kill()
            raise RuntimeError("qspec serve did not listen:\n" + "".join(self.log))
        if wait_ready:
            self.wait_ready()

    def _read_stderr(self):
        for line in self.process.stderr:
            self.log.append(line)
            match = re.search(r"listening on http://([\d.]+):(\d+)", line)
            if match:
                self.url = f"http://{match.group(1)}:{match.group(2)}"
                self._listening.set()

    def wait_ready(self, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if httpx.get(self.url + "/health").status_code == 200:
                return
            assert self.process.poll() is None, "".join(self.log)
            time.sleep(0.01)
        raise RuntimeError("qspec serve never became ready:\n" + "".join(self.log))

    def client(self, api_key="none", **kwargs):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, **kwargs)

    def access_log(self):
        return [json.loads(line[line.index("{"):]) for line in self.log if '"request_id"' in line]

    def rss_kib(self):
        status = pathlib.Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.process.poll() is None:
            self.process.send_signal(sig)
        code = self.process.wait(timeout)
        self._reader.join(5)
        return code


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "tiny"
    subprocess.run([QSPEC, "synth", "--arch", "qwen3.5-tiny", "--tokenizer", str(TOKENIZER_DIR), "--out", str(out)],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def server(tiny_model):
    """The shared server: the tiny model under the name "tiny"."""
    running = Server(tiny_model, "--served-model-name", "tiny")
    yield running
    assert running.stop() == 0


@pytest.fixture(scope="session")
def client(server):
    return server.client()


def generate(model, *args):
    """`qspec generate --json` for the same request: the reference the server must equal."""
    run = subprocess.run([QSPEC, "generate", "--model", str(model), "--json", *args],
                         check=True, capture_output=True, text=True)
    return json.loads(run.stdout)


def metrics(url):
    from prometheus_client.parser import text_string_to_metric_families
    samples = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k != "model_name")))
            samples[key] = sample.value
    return samples
