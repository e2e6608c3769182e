"""The served backend's HTTP side: the API key from the environment (never written anywhere), the model listing,
one connection's requests (`ServerConnection`: the request cache, retries with exponential backoff and jitter on
429, 5xx, connection errors and timeouts, the cost of each reply) and a server's refusal read back in one line."""

from __future__ import annotations

import asyncio
import os
import random
import sys
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
from tqdm.auto import tqdm

from flexsearch.errors import FlexsearchError, ServerUnavailable
from flexsearch.scoring.backends.answers import top_logprobs_of
from flexsearch.scoring.backends.request_cache import RequestCache
from flexsearch.scoring.backends.served_options import ServedOptions
from flexsearch.scoring.backends.usage import Usage

T = TypeVar("T")


KEY_VARIABLES = ("FLEXSEARCH_API_KEY", "OPENAI_API_KEY")  # the first one set is used


RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


MAX_BACKOFF_S = 30.0


def auth_headers() -> dict[str, str]:
    """The bearer header of the key in FLEXSEARCH_API_KEY, else OPENAI_API_KEY; none when neither is set (local
    servers)."""
    for name in KEY_VARIABLES:
        if os.environ.get(name):
            return {"Authorization": f"Bearer {os.environ[name]}"}
    return {}


def run_to_completion(work: Coroutine[Any, Any, T]) -> T:
    """Runs a coroutine from synchronous code, also where an event loop is already running (a notebook): there
    in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, work).result()


def backoff_seconds(attempt: int, retry_after: str | None) -> float:
    """Exponential backoff with full jitter (0.5 s doubling, at most MAX_BACKOFF_S); a server's Retry-After
    in seconds, when given, is the least."""
    wait = random.uniform(0, min(MAX_BACKOFF_S, 0.5 * 2**attempt))
    try:
        return max(wait, min(float(retry_after), MAX_BACKOFF_S)) if retry_after else wait
    except ValueError:  # an HTTP date: keep the jittered wait
        return wait


def refuses_logprobs(response: httpx.Response) -> bool:
    """An error reply that refuses logprobs, which no retry changes (llama-cpp-python answers HTTP 500 "logprobs
    is not supported" when started without --logits_all)."""
    try:
        return "logprob" in server_message(response.json()).lower()
    except ValueError:
        return False


def server_message(reply: Any) -> str:
    """The error text of an OpenAI-style error reply, on one line."""
    if not isinstance(reply, dict):
        return " ".join(str(reply).split())[:300]
    error = reply.get("error")
    text = error.get("message") if isinstance(error, dict) else error or reply.get("detail")
    return " ".join(str(text or reply).split())[:300]


def list_models(options: ServedOptions) -> list[dict[str, Any]]:
    """The server's /models listing; an unreachable host, a refusal or a reply that is not a model list is one line."""
    url = f"{options.base_url}/models"
    try:
        response = httpx.get(url, timeout=min(options.request_timeout, 30),
                             headers=auth_headers())
    except httpx.TransportError as err:
        raise FlexsearchError(f"--base-url {options.base_url}: cannot reach {options.host} ({type(err).__name__}); "
                              "is the server running?") from None
    try:
        reply = response.json()
    except ValueError:
        raise FlexsearchError(f"--base-url {options.base_url}: {url} answered HTTP {response.status_code} with a "
                              "reply that is not JSON (not an OpenAI-compatible /v1 root?)") from None
    if response.status_code in (401, 403):
        raise FlexsearchError(f"--base-url {options.base_url}: the server refused the key (HTTP "
                              f"{response.status_code}); set it in {KEY_VARIABLES[0]} (or {KEY_VARIABLES[1]})")
    data = reply.get("data") if isinstance(reply, dict) else None
    if response.status_code >= 400 or not isinstance(data, list):
        raise FlexsearchError(f"--base-url {options.base_url}: {url} did not list models (HTTP "
                              f"{response.status_code}: {server_message(reply)}); not an OpenAI-compatible /v1 root?")
    return [entry for entry in data if isinstance(entry, dict)]


class ModeUnsupported(FlexsearchError):
    """The server answers, but not in the asked scoring mode (no logprobs, a top-k it refuses)."""


class ServerConnection:
    """One served model's requests: a reply from the request cache, or sent and retried on 429, 5xx, connection
    errors and timeouts with exponential backoff and full jitter; what each reply cost is counted in `usage`."""

    def __init__(self, options: ServedOptions, model_id: str) -> None:
        self.options, self.model_id = options, model_id
        self.usage = Usage()
        self.cache = RequestCache(options.request_cache)
        self.headers = auth_headers()

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self.options.request_timeout, headers=self.headers)

    async def reply(self, client: httpx.AsyncClient, limit: asyncio.Semaphore, endpoint: str,
                     body: dict[str, Any], cached: bool = True) -> dict[str, Any]:
        """The server's reply to one request: from the cache (unless `cached` is off), or sent and retried on
        429, 5xx, connection errors and timeouts with exponential backoff and full jitter."""
        key = RequestCache.key((self.options.host, self.model_id, endpoint), body)
        kept = self.cache.get(key) if cached else None
        if kept is not None:
            self.usage.cache_hits += 1
            return kept
        url = f"{self.options.base_url}/{endpoint}"
        attempt = 0
        while True:
            async with limit:
                try:
                    response = await client.post(url, json=body)
                    retry = response.status_code in RETRY_STATUSES and not refuses_logprobs(response)
                    problem = f"HTTP {response.status_code}" if retry else None
                except httpx.TransportError as err:  # connection refused or reset, timeouts
                    response, problem = None, type(err).__name__
            if problem is None and response is not None:
                reply = self.checked(response, endpoint)
                self.usage.requests += 1
                used = reply.get("usage") or {}
                self.usage.prompt_tokens += int(used.get("prompt_tokens") or 0)
                # OpenAI's field, which llama.cpp's llama-server and vLLM fill in; llama-cpp-python's server does not
                details = used.get("prompt_tokens_details") or {}
                self.usage.cached_prompt_tokens += int(details.get("cached_tokens") or 0)
                self.usage.completion_tokens += int(used.get("completion_tokens") or 0)
                kept = {"choices": reply["choices"]}
                self.cache.put(key, kept)
                return kept
            if attempt >= self.options.retries:
                raise ServerUnavailable(f"the server at {self.options.host} did not answer ({problem}) after "
                                        f"{self.options.retries} retries; what finished is kept: rerun the same "
                                        "command to resume once it answers")
            wait = backoff_seconds(attempt, response.headers.get("retry-after") if response is not None else None)
            attempt += 1
            self.usage.retries += 1
            tqdm.write(f"served model {self.options.host}: {problem}; retry {attempt} of {self.options.retries} "
                       f"in {wait:.1f} s", file=sys.stderr)
            await asyncio.sleep(wait)

    def checked(self, response: httpx.Response, endpoint: str) -> dict[str, Any]:
        """The JSON reply of a request the server answered without a retryable status, or one line saying why
        it is unusable."""
        where = f"{self.options.host} /{endpoint}"
        try:
            reply = response.json()
        except ValueError:
            raise FlexsearchError(f"--base-url {self.options.base_url}: {where} answered HTTP {response.status_code} "
                                  "with a reply that is not JSON (is it an OpenAI-compatible server?)") from None
        if response.status_code >= 400:
            message = server_message(reply)
            if response.status_code in (401, 403):
                raise FlexsearchError(f"{where} refused the request (HTTP {response.status_code}: {message}); set "
                                      f"the key in {KEY_VARIABLES[0]} (or {KEY_VARIABLES[1]})")
            if "logprob" in message.lower():
                raise ModeUnsupported(f"{where} refused top_logprobs={self.options.top_logprobs} "
                                      f"(HTTP {response.status_code}: {message}); give a smaller --top-logprobs, "
                                      "or --served-mode sample if it returns no logprobs (llama.cpp's server "
                                      "returns them when started with --logits_all true)")
            raise FlexsearchError(f"{where} refused the request (HTTP {response.status_code}: {message})")
        choices = reply.get("choices") if isinstance(reply, dict) else None
        if not isinstance(choices, list) or not choices:
            raise FlexsearchError(f"{where}: the reply has no choices (is it an OpenAI-compatible server?)")
        if self.options.mode != "sample" and not top_logprobs_of(choices[0]):
            instead = "sample" if self.options.mode == "chat-logprobs" else "chat-logprobs or sample"
            raise ModeUnsupported(f"{where} returned no logprobs in --served-mode {self.options.mode}; use "
                                  f"--served-mode {instead} (llama.cpp's server returns them when started with "
                                  "--logits_all true)")
        return reply
