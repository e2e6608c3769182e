"""Served targets: scoring prompts on a model behind an OpenAI-compatible server (DESIGN.md "Served targets").

`--model openai:NAME --base-url http://host:port/v1` names a model a vLLM, llama.cpp, TGI or hosted server
serves. The backend turns each rendered prompt into requests, in one of three modes:

- `logprobs`: /completions, one generated token, the top-k logprobs of that token;
- `chat-logprobs`: /chat/completions with `logprobs`/`top_logprobs`, for chat-only servers;
- `sample`: n sampled answers per prompt, the option letter parsed from each (`parse_answer`).

`auto` (the default) probes the server once, without the request cache, and takes the first mode of the prompt
layout that answers: the layout's logprob mode, then `sample`; it says which and why in one line, and records
it. A chat prompt is kept as the JSON list of its messages (the server applies its own template), so the
split shows which text went to the system message and which to the user turn.

Requests run concurrently (bounded), are retried with exponential backoff and jitter on 429, 5xx, connection
errors and timeouts, and are kept in an on-disk cache, so a resumed or repeated run never pays twice. The API
key comes from the environment only and is never written anywhere.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import random
import re
import sqlite3
import sys
import time
from collections.abc import Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import numpy as np
from tqdm.auto import tqdm

from flexsearch.candidate import Candidate
from flexsearch.config import ScoringConfig
from flexsearch.errors import FlexsearchError, ServerUnavailable
from flexsearch.model import TargetModel, cache_root
from flexsearch.render import LETTERS, PromptFormat, chat_turns, render
from flexsearch.served_defaults import SERVED_DEFAULTS

T = TypeVar("T")
SERVED_PREFIX = "openai:"
SERVED_MODES = ("logprobs", "chat-logprobs", "sample")
AUTO = "auto"
PROBED = {"plain": ("logprobs", "sample"), "chat": ("chat-logprobs", "sample")}  # auto's order per prompt layout
KEY_VARIABLES = ("FLEXSEARCH_API_KEY", "OPENAI_API_KEY")  # the first one set is used
PROBE_PROMPT = "Q: Which letter comes first?\nOption: (A) A\n(B) B\n(C) C"  # checks logprobs come back
SAMPLE_MAX_TOKENS = 16  # enough for "(B) the grandson" or "The answer is C"
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_BACKOFF_S = 30.0


def is_served(spec: str) -> bool:
    return spec.startswith(SERVED_PREFIX)


def auth_headers() -> dict[str, str]:
    """The bearer header of the key in FLEXSEARCH_API_KEY, else OPENAI_API_KEY; none when neither is set (local
    servers)."""
    for name in KEY_VARIABLES:
        if os.environ.get(name):
            return {"Authorization": f"Bearer {os.environ[name]}"}
    return {}


@dataclass(frozen=True)
class ServedOptions:
    """A served target as the user asked for it (checked by `served_options`)."""

    name: str  # the model name sent with every request (the part after "openai:")
    base_url: str  # ".../v1", no trailing slash, no user:password part
    mode: str  # logprobs | chat-logprobs | sample, or auto until the server is probed
    top_logprobs: int
    samples: int
    temperature: float
    concurrency: int
    request_timeout: float
    retries: int
    request_cache: bool

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).netloc

    @property
    def queries_per_prompt(self) -> int:
        return self.samples if self.mode == "sample" else 1

    def result_settings(self) -> dict[str, Any]:
        """What decides the scores (recorded in config.yaml; a resume must match it)."""
        settings: dict[str, Any] = {"host": self.host, "mode": self.mode}
        if self.mode != "sample":
            settings["top_logprobs"] = self.top_logprobs
        if self.mode in ("sample", AUTO):
            settings.update(samples=self.samples, temperature=self.temperature)
        return settings


def served_options(target: dict[str, Any], scoring_mode: str) -> ServedOptions | None:
    """The served options of an api.Target's arguments, checked (one line per problem, before anything is
    written); None for an in-process model."""
    spec, base_url = target["model"], target.get("base_url")
    if not is_served(spec):
        for key, default in SERVED_DEFAULTS.items():
            if target.get(key, default) != default:
                raise FlexsearchError(f"--{key.replace('_', '-')} is for a served model: give --model "
                                      f"{SERVED_PREFIX}NAME (NAME as the server lists it) and --base-url")
        return None
    name = spec.removeprefix(SERVED_PREFIX)
    if not name:
        raise FlexsearchError(f"--model {spec}: give the served model's name after '{SERVED_PREFIX}'")
    if not base_url:
        raise FlexsearchError(f"--model {spec} needs --base-url, the server's /v1 root "
                              "(e.g. http://127.0.0.1:8000/v1)")
    settings = {key: target.get(key, default) for key, default in SERVED_DEFAULTS.items()}
    mode = settings["served_mode"] or AUTO
    if mode not in (AUTO, *SERVED_MODES):
        raise FlexsearchError(f"--served-mode: unknown mode '{mode}' (choose from {AUTO}, {', '.join(SERVED_MODES)})")
    layout = {"logprobs": "plain", "chat-logprobs": "chat"}.get(mode, scoring_mode)
    if layout != scoring_mode:
        fitting = "chat-logprobs" if scoring_mode == "chat" else "logprobs"
        raise FlexsearchError(f"--served-mode {mode} scores the {layout} prompt layout, but scoring.mode is "
                              f"{scoring_mode}: use --served-mode {fitting} or sample")
    for key, low in (("top_logprobs", 1), ("samples", 1), ("concurrency", 1), ("retries", 0)):
        if not isinstance(settings[key], int) or settings[key] < low:
            raise FlexsearchError(f"--{key.replace('_', '-')}: must be a whole number of at least {low}")
    if not settings["request_timeout"] > 0:
        raise FlexsearchError("--request-timeout: must be more than 0 seconds")
    if not 0 <= settings["temperature"] <= 2:
        raise FlexsearchError("--temperature: must be between 0 and 2")
    return ServedOptions(name=name, base_url=check_base_url(base_url), mode=mode,
                         top_logprobs=settings["top_logprobs"], samples=settings["samples"],
                         temperature=float(settings["temperature"]), concurrency=settings["concurrency"],
                         request_timeout=float(settings["request_timeout"]), retries=settings["retries"],
                         request_cache=bool(settings["request_cache"]))


def check_base_url(url: str) -> str:
    """An http(s) URL whose path is an OpenAI-compatible /v1 root, without a trailing slash or credentials."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FlexsearchError(f"--base-url {url}: give a full URL with its scheme, e.g. http://{url.lstrip('/')}"
                              if "://" not in url else f"--base-url {url}: not an http(s) URL")
    if parts.username or parts.password:
        raise FlexsearchError("--base-url: holds a user name or password; give the key in FLEXSEARCH_API_KEY instead")
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        raise FlexsearchError(f"--base-url {url}: not an OpenAI-compatible /v1 root (it should end in /v1, e.g. "
                              f"{parts.scheme}://{parts.netloc}/v1)")
    if parts.query or parts.fragment:
        raise FlexsearchError(f"--base-url {url}: a /v1 root takes no query or fragment")
    return f"{parts.scheme}://{parts.netloc}{path}"


# ---------------------------------------------------------------- reading answers


def letter_logprobs(top: Sequence[tuple[str, float]]) -> tuple[np.ndarray, float, int]:
    """Log P of each option letter from one position's top-k (token, logprob) pairs.

    A token counts for a letter when, stripped of white space, a leading '(' and a trailing ')', '.' or ':', it
    is the letter (so 'A', ' A' and '(A' all count; their probabilities add). A letter missing from the top-k
    gets the smallest returned logprob, an upper bound on its own. Returns (log P per letter, covered mass =
    the letters' summed probability as returned, number of letters bounded)."""
    found: dict[str, float] = {}
    for token, logprob in top:
        core = token.strip().removeprefix("(").strip().rstrip(").:")
        if core in LETTERS:
            found[core] = float(np.logaddexp(found[core], logprob)) if core in found else float(logprob)
    floor = min((lp for _, lp in top), default=-math.inf)
    logs = np.array([found.get(letter, floor) for letter in LETTERS])
    covered = float(sum(math.exp(v) for v in found.values()))
    return logs, covered, 3 - len(found)


_REFUSAL = re.compile(r"\b(I\s+(cannot|can't|can not|won't|will not|am unable|'m unable|am not able)|I'm sorry|"
                      r"I am sorry|as an AI|I (do not|don't) feel comfortable)\b", re.IGNORECASE)
_LEADING_LETTER = re.compile(r"^\s*\(?\s*([ABC])\s*(\)|\.|:|,|$|\s)")
_STATED_LETTER = re.compile(r"\banswer\s*(?:is|would be)?\s*[:\-]?\s*\(?([ABC])\)?(?![A-Za-z])", re.IGNORECASE)


def parse_answer(text: str) -> str:
    """The option letter a sampled answer gives, 'refusal', or 'unparseable' (DESIGN.md "Served targets").

    In order: a letter the text starts with ('B', '(B) ...', 'C.' and, after the plain prompt's 'Answer: (',
    'A) ...'); a refusal ('I cannot...', "I'm sorry", 'as an AI'); a stated letter ('the answer is (C)');
    otherwise unparseable."""
    leading = _LEADING_LETTER.match(text)
    if leading:
        return leading.group(1)
    if _REFUSAL.search(text):
        return "refusal"
    stated = _STATED_LETTER.search(text)
    return stated.group(1) if stated else "unparseable"


# ---------------------------------------------------------------- the request cache


class RequestCache:
    """Request → reply, on disk (SQLite, one file under the flexsearch cache), shared by every run on this
    machine. Keys hash the server's host and model id and the whole request body."""

    def __init__(self, enabled: bool) -> None:
        self._db: sqlite3.Connection | None = None
        if enabled:
            path = cache_root() / "served-requests.sqlite"
            path.parent.mkdir(parents=True, exist_ok=True)
            # used from one thread at a time, not always the one that opened it (run_to_completion)
            self._db = sqlite3.connect(path, timeout=60, check_same_thread=False)
            self._db.execute("CREATE TABLE IF NOT EXISTS reply (key TEXT PRIMARY KEY, value TEXT NOT NULL)")

    @staticmethod
    def key(scope: Sequence[str], body: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps([*scope, body], sort_keys=True).encode()).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        if self._db is None:
            return None
        row = self._db.execute("SELECT value FROM reply WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        if self._db is not None:
            self._db.execute("INSERT OR REPLACE INTO reply VALUES (?, ?)", (key, json.dumps(value)))
            self._db.commit()  # each reply is kept as it arrives: a server lost mid-batch costs only the rest


# ---------------------------------------------------------------- the backend


@dataclass
class Usage:
    """What the served scoring cost and how the answers read (score.json `usage`)."""

    requests: int = 0  # answered over the network
    cache_hits: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of those, what the server reports it took from its key/value cache
    completion_tokens: int = 0
    request_seconds: float = 0.0  # wall time spent waiting for batches of requests
    bounded_prompts: int = 0  # logprob modes: a letter missing from the top-k, bounded by the smallest logprob
    covered_mass: list[float] = field(default_factory=list)  # logprob modes: per prompt scored
    answers: dict[str, int] = field(default_factory=lambda: {**dict.fromkeys(LETTERS, 0), "refusal": 0,
                                                             "unparseable": 0})  # sample mode
    no_answer_prompts: int = 0  # sample mode: no sample gave a letter (scored uniform)

    def merge(self, counters: dict[str, Any]) -> None:
        """Adds another Usage's fields (dataclasses.asdict of it)."""
        for name, value in counters.items():
            mine = getattr(self, name)
            if isinstance(mine, dict):
                for key, count in value.items():
                    mine[key] = mine.get(key, 0) + count
            elif isinstance(mine, list):
                mine.extend(value)
            else:
                setattr(self, name, mine + value)

    def to_dict(self, mode: str) -> dict[str, Any]:
        found: dict[str, Any] = {"requests": self.requests, "cache_hits": self.cache_hits, "retries": self.retries,
                                 "prompt_tokens": self.prompt_tokens, "cached_prompt_tokens": self.cached_prompt_tokens,
                                 "completion_tokens": self.completion_tokens,
                                 "request_seconds": round(self.request_seconds, 2)}
        if mode == "sample":
            samples = sum(self.answers.values())
            found.update(samples=samples, answers=self.answers, no_answer_prompts=self.no_answer_prompts,
                         refusal_rate=round(self.answers["refusal"] / samples, 4) if samples else None)
        else:
            mass = np.array(self.covered_mass) if self.covered_mass else np.zeros(1)
            found.update(bounded_prompts=self.bounded_prompts, covered_mass={
                "prompts": len(self.covered_mass), "mean": round(float(mass.mean()), 4),
                "min": round(float(mass.min()), 4), "below_0_5": int((mass < 0.5).sum())})
        return found


class ModeUnsupported(FlexsearchError):
    """The server answers, but not in the asked scoring mode (no logprobs, a top-k it refuses)."""


class ServedBackend:
    """The black-box backend: prompts scored by an OpenAI-compatible server (module docstring)."""

    white_box: TargetModel | None = None
    max_prompt_tokens = 1 << 30  # the server enforces its own context; a prompt it refuses is an error

    def __init__(self, options: ServedOptions, scoring: ScoringConfig, model_id: str, listing: dict[str, Any]) -> None:
        self.options = options
        self.fmt = PromptFormat(mode="plain")  # its answer prefix ends every prompt; chat prompts are messages
        self.slot = scoring.slot
        self.queries_per_prompt = options.queries_per_prompt
        self.info = {"model": f"{SERVED_PREFIX}{options.name}", "served": options.result_settings(),
                     "server_model_id": model_id,
                     **{k: listing[k] for k in ("owned_by", "root", "max_model_len") if listing.get(k) is not None},
                     "prompt_format": {"mode": scoring.mode, "slot": scoring.slot,
                                       **({"chat_template": "the server's own"} if scoring.mode == "chat" else {})}}
        self.usage_so_far = Usage()
        self._cache = RequestCache(options.request_cache)
        self._headers = auth_headers()
        # the chat layout's modes send the prompt as messages to /chat/completions
        self._chat = options.mode == "chat-logprobs" or (options.mode == "sample" and scoring.mode == "chat")

    @classmethod
    def connect(cls, target: dict[str, Any], scoring: ScoringConfig) -> ServedBackend:
        """Checks the options, lists the server's models (the name must be one) and probes the scoring mode
        with one short request: an asked mode must answer; auto takes the first of the layout's modes that does
        and says which in one line. Each failure is one line."""
        options = served_options(target, scoring.mode)
        assert options is not None
        listing = list_models(options)
        names = [str(entry.get("id")) for entry in listing]
        if options.name not in names:
            raise FlexsearchError(f"--model {SERVED_PREFIX}{options.name}: {options.host} serves "
                                  f"{', '.join(names) or 'no models'} (give one of them after '{SERVED_PREFIX}')")
        entry = listing[names.index(options.name)]
        if options.mode != AUTO:
            backend = cls(options, scoring, str(entry.get("id")), entry)
            backend.probe()
            return backend
        refused: list[str] = []
        for mode in PROBED[scoring.mode]:
            backend = cls(replace(options, mode=mode), scoring, str(entry.get("id")), entry)
            try:
                backend.probe()
            except ModeUnsupported as err:
                refused.append(f"{mode}: {err}")
                continue
            found = mode_found(mode, options, refused)
            backend.info["served_mode_probe"] = found
            tqdm.write(f"served model {options.host}: --served-mode auto chose {mode} ({found['why']})",
                       file=sys.stderr)
            return backend
        raise FlexsearchError(f"--served-mode auto: {options.host} answers in none of the scoring modes "
                              f"({'; '.join(refused)})")

    def probe(self) -> None:
        """One request with a short prompt, past the request cache (a restarted server may have changed): the
        mode's reply comes back, or ModeUnsupported says why not."""
        prompt = self.prompt_of([{"role": "user", "content": PROBE_PROMPT}])
        endpoint, body = self.requests_for(prompt)[0]

        async def ask() -> dict[str, Any]:
            async with httpx.AsyncClient(timeout=self.options.request_timeout, headers=self._headers) as client:
                return await self._reply(client, asyncio.Semaphore(1), endpoint, body, cached=False)

        reply = run_to_completion(ask())
        if self.options.mode == "sample" and not choice_text(reply["choices"][0]):
            raise ModeUnsupported(f"{self.options.host} /{endpoint} returned no text to parse an answer from")

    # -- the protocol

    def prompt_of(self, turns: list[dict[str, str]]) -> str:
        """A prompt as scored and as the split shows it: plain text, or in the chat layout the JSON list of
        its messages; both end in the answer prefix."""
        if self._chat:
            return f"{json.dumps(turns, ensure_ascii=False)}\n{self.fmt.answer_prefix}"
        return "\n".join(turn["content"] for turn in turns) + f"\n{self.fmt.answer_prefix}"

    def render(self, candidate: Candidate) -> str:
        if self._chat:
            return self.prompt_of(chat_turns(candidate, self.slot))
        return render(candidate, None, self.fmt)

    def prompt_tokens(self, prompt: str) -> None:
        return None

    def usage(self) -> dict[str, Any]:
        return self.usage_so_far.to_dict(self.options.mode)

    def progress(self) -> dict[str, str]:
        used = self.usage_so_far
        rate = used.requests / max(used.request_seconds, 1e-9)
        return {"req_per_s": f"{rate:.1f}", "retries": str(used.retries)}

    def take_usage(self) -> dict[str, Any]:
        taken, self.usage_so_far = asdict(self.usage_so_far), Usage()
        return taken

    def merge_usage(self, counters: dict[str, Any]) -> None:
        self.usage_so_far.merge(counters)

    def letter_probs(self, prompts: Sequence[str]) -> np.ndarray:
        started = time.perf_counter()
        try:
            return run_to_completion(self._score_all(prompts))
        finally:
            self.usage_so_far.request_seconds += time.perf_counter() - started

    # -- requests

    def requests_for(self, prompt: str) -> list[tuple[str, dict[str, Any]]]:
        """(endpoint, body) of every request one prompt takes."""
        options = self.options
        if not prompt.endswith(self.fmt.answer_prefix):
            raise FlexsearchError(f"prompt does not end in the answer prefix: ...{prompt[-40:]!r}")
        if self._chat:
            # the prompt's messages, then the answer prefix opening the assistant's reply (servers that can
            # continue a final assistant message, vLLM's continue_final_message, read on from it)
            turns = json.loads(prompt[: -len(self.fmt.answer_prefix)])
            body: dict[str, Any] = {"messages": [*turns, {"role": "assistant", "content": self.fmt.answer_prefix}],
                                    "continue_final_message": True, "add_generation_prompt": False}
            endpoint = "chat/completions"
        else:
            body, endpoint = {"prompt": prompt}, "completions"
        body["model"] = options.name
        if options.mode == "sample":
            seed = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "little")
            return [(endpoint, {**body, "max_tokens": SAMPLE_MAX_TOKENS, "temperature": options.temperature,
                                "seed": seed + k}) for k in range(options.samples)]
        body.update(max_tokens=1, temperature=0.0)
        if self._chat:
            body.update(logprobs=True, top_logprobs=options.top_logprobs)
        else:
            body["logprobs"] = options.top_logprobs
        return [(endpoint, body)]

    async def _score_all(self, prompts: Sequence[str]) -> np.ndarray:
        limit = asyncio.Semaphore(self.options.concurrency)
        async with httpx.AsyncClient(timeout=self.options.request_timeout, headers=self._headers) as client:
            async def one(prompt: str) -> np.ndarray:
                replies = await asyncio.gather(*(self._reply(client, limit, endpoint, body)
                                                 for endpoint, body in self.requests_for(prompt)))
                return self._read(replies)

            dispatch = prefix_order(prompts)
            tasks = [asyncio.ensure_future(one(prompts[i])) for i in dispatch]
            try:
                replies = np.reshape(await asyncio.gather(*tasks), (len(prompts), 3))
                rows = np.empty_like(replies)
                rows[dispatch] = replies  # each reply back to its prompt's place
                return rows
            except BaseException:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise

    async def _reply(self, client: httpx.AsyncClient, limit: asyncio.Semaphore, endpoint: str,
                     body: dict[str, Any], cached: bool = True) -> dict[str, Any]:
        """The server's reply to one request: from the cache (unless `cached` is off), or sent and retried on
        429, 5xx, connection errors and timeouts with exponential backoff and full jitter."""
        key = RequestCache.key((self.options.host, str(self.info["server_model_id"]), endpoint), body)
        kept = self._cache.get(key) if cached else None
        if kept is not None:
            self.usage_so_far.cache_hits += 1
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
                reply = self._checked(response, endpoint)
                self.usage_so_far.requests += 1
                used = reply.get("usage") or {}
                self.usage_so_far.prompt_tokens += int(used.get("prompt_tokens") or 0)
                # OpenAI's field, which llama.cpp's llama-server and vLLM fill in; llama-cpp-python's server does not
                details = used.get("prompt_tokens_details") or {}
                self.usage_so_far.cached_prompt_tokens += int(details.get("cached_tokens") or 0)
                self.usage_so_far.completion_tokens += int(used.get("completion_tokens") or 0)
                kept = {"choices": reply["choices"]}
                self._cache.put(key, kept)
                return kept
            if attempt >= self.options.retries:
                raise ServerUnavailable(f"the server at {self.options.host} did not answer ({problem}) after "
                                        f"{self.options.retries} retries; what finished is kept: rerun the same "
                                        "command to resume once it answers")
            wait = backoff_seconds(attempt, response.headers.get("retry-after") if response is not None else None)
            attempt += 1
            self.usage_so_far.retries += 1
            tqdm.write(f"served model {self.options.host}: {problem}; retry {attempt} of {self.options.retries} "
                       f"in {wait:.1f} s", file=sys.stderr)
            await asyncio.sleep(wait)

    def _checked(self, response: httpx.Response, endpoint: str) -> dict[str, Any]:
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

    def _read(self, replies: Sequence[dict[str, Any]]) -> np.ndarray:
        """P(A), P(B), P(C) from one prompt's replies."""
        used = self.usage_so_far
        if self.options.mode == "sample":
            answers = [parse_answer(choice_text(reply["choices"][0])) for reply in replies]
            for answer in answers:
                used.answers[answer] += 1
            counts = np.array([answers.count(letter) for letter in LETTERS], dtype=np.float64)
            if counts.sum() == 0:
                used.no_answer_prompts += 1
                return np.full(3, 1 / 3)
            return counts / counts.sum()
        logs, covered, bounded = letter_logprobs(top_logprobs_of(replies[0]["choices"][0]))
        used.covered_mass.append(covered)
        used.bounded_prompts += bounded > 0
        weights = np.exp(logs - logs.max())
        return weights / weights.sum()


def prefix_order(prompts: Sequence[str]) -> list[int]:
    """The order to send prompts in: sorted by their text, so prompts sharing a prefix (a candidate's option
    orders, candidates sharing a persona and context) go one after another and a server that keeps the previous
    prompt's key/value cache (llama.cpp) computes only what differs. Requests are sent in this order, at most
    --concurrency at a time (asyncio's semaphore wakes waiters first come, first served)."""
    return sorted(range(len(prompts)), key=prompts.__getitem__)


def mode_found(mode: str, options: ServedOptions, refused: Sequence[str]) -> dict[str, Any]:
    """What --served-mode auto found (config.yaml and score.json under the model): the mode and why."""
    if mode == "sample":
        why = (f"no logprobs ({'; '.join(refused)}); {options.samples} sampled answers per prompt, each one "
               "query of the budget")
    else:
        endpoint = "/chat/completions" if mode == "chat-logprobs" else "/completions"
        why = f"{endpoint} returned top-{options.top_logprobs} logprobs of the next token"
    return {"asked": AUTO, "mode": mode, "why": why, "refused": list(refused)}


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


def top_logprobs_of(choice: dict[str, Any]) -> list[tuple[str, float]]:
    """The first generated token's top-k (token, logprob) pairs, in either endpoint's shape: /completions'
    `top_logprobs` (a mapping per position), /chat/completions' `content[0].top_logprobs` (a list)."""
    logprobs = choice.get("logprobs") or {}
    if isinstance(logprobs.get("content"), list) and logprobs["content"]:
        return [(str(e.get("token", "")), float(e["logprob"])) for e in logprobs["content"][0].get("top_logprobs") or []
                if isinstance(e, dict) and e.get("logprob") is not None]
    top = logprobs.get("top_logprobs")
    if isinstance(top, list) and top and isinstance(top[0], dict):
        return [(str(token), float(lp)) for token, lp in top[0].items() if lp is not None]
    return []


def choice_text(choice: dict[str, Any]) -> str:
    message = choice.get("message")
    return str((message or {}).get("content") or "") if isinstance(message, dict) else str(choice.get("text") or "")


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
