"""A llama.cpp server on 127.0.0.1 for the served-target tests and bench_served: llama-cpp-python's OpenAI-compatible
one (`LlamaServer`), or llama.cpp's own `llama-server` binary (`LlamaCppServer`, bench_served --llama-server),
started on a free port with an embedded GGUF, stopped, killed and restarted on the same port."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from flexsearch.scoring.model import resolve_gguf

ALIAS = "smollm2"  # the served model's name, as /v1/models lists it
# the server's (verbose) log line for a prompt whose start was still in its key/value cache
PREFIX_HIT = re.compile(r"Llama\.generate: (\d+) prefix-match hit")


def embedded_gguf(alias: str = "smollm2") -> Path:
    found = resolve_gguf(alias, None)
    assert found is not None
    return found[0] / found[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LlamaServer:
    """`python -m llama_cpp.server` serving one GGUF under ALIAS (by default with logits for every position, so
    /completions returns top-k logprobs; `logits_all=False` is the server as started without the flag)."""

    def __init__(self, gguf: Path, port: int | None = None, threads: int = 2, log: Path | None = None,
                 logits_all: bool = True) -> None:
        self.gguf, self.port, self.threads = gguf, port or free_port(), threads
        self.log, self.logits_all = log, logits_all
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "llama_cpp.server", "--model", str(self.gguf), "--model_alias", ALIAS,
                "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", "2048", "--n_threads",
                str(self.threads), "--logits_all", "true" if self.logits_all else "false"]

    def start(self, timeout_s: float = 120) -> LlamaServer:
        command = self.command()
        output = self.log.open("ab") if self.log else subprocess.DEVNULL
        self.process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama.cpp server exited with {self.process.returncode} (log: {self.log})")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"llama.cpp server did not answer within {timeout_s} s")

    def kill(self) -> None:
        """SIGKILL, as a crashed server."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_size(self) -> int:
        return self.log.stat().st_size if self.log and self.log.exists() else 0

    def reused_tokens(self, since: int = 0) -> int | None:
        """Prompt tokens the server took from its key/value cache instead of computing, logged after byte
        `since` of its log (needs `log`)."""
        assert self.log is not None, "start the server with a log to count its prefix reuse"
        with self.log.open("rb") as text:
            text.seek(since)
            return sum(int(hit) for hit in PREFIX_HIT.findall(text.read().decode(errors="replace")))

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LlamaCppServer(LlamaServer):
    """llama.cpp's own `llama-server` binary (`make setup-llama-server` builds it into the environment): it returns
    the next token's top-k logprobs from the last position's logits alone and keeps each slot's key/value cache
    between requests (`cache_prompt`, on by default). One slot by default, as the README starts it: the client's
    sorted prompts then queue on one cache, each reusing the start it shares with the one before (several slots
    spread a candidate's option orders over several caches; RESULTS "Served targets: ... llama-server")."""

    def __init__(self, binary: Path, gguf: Path, port: int | None = None, threads: int = 2, log: Path | None = None,
                 slots: int = 1) -> None:
        super().__init__(gguf, port, threads, log)
        self.binary, self.slots = binary, slots

    def command(self) -> list[str]:
        return [str(self.binary), "--model", str(self.gguf), "--alias", ALIAS, "--host", "127.0.0.1", "--port",
                str(self.port), "--ctx-size", str(2048 * self.slots), "--parallel", str(self.slots), "--threads",
                str(self.threads), "--no-webui"]

    def reused_tokens(self, since: int = 0) -> int | None:
        """None: llama-server reports its cache reuse in each reply (usage `prompt_tokens_details.cached_tokens`,
        score.json usage `cached_prompt_tokens`), not in its log."""
        return None
