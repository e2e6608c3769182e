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
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from flexsearch.config import ScoringConfig
from flexsearch.data.candidate import Candidate
from flexsearch.data.render import PromptFormat, chat_turns, render
from flexsearch.errors import FlexsearchError
from flexsearch.scoring.backends.answers import (
    choice_text,
    letter_probs_of,
)
from flexsearch.scoring.backends.base import BACKENDS
from flexsearch.scoring.backends.http import (
    ModeUnsupported,
    ServerConnection,
    list_models,
    run_to_completion,
)
from flexsearch.scoring.backends.served_options import (
    AUTO,
    PROBED,
    SERVED_PREFIX,
    ServedOptions,
    served_options,
)
from flexsearch.scoring.backends.usage import Usage
from flexsearch.scoring.model import TargetModel

PROBE_PROMPT = "Q: Which letter comes first?\nOption: (A) A\n(B) B\n(C) C"  # checks logprobs come back
SAMPLE_MAX_TOKENS = 16  # enough for "(B) the grandson" or "The answer is C"


# ---------------------------------------------------------------- reading answers


# ---------------------------------------------------------------- the request cache


# ---------------------------------------------------------------- the backend


@BACKENDS.register(SERVED_PREFIX.removesuffix(":"))
class ServedBackend:
    """The black-box backend: `openai:NAME` at --base-url, prompts scored by any OpenAI-compatible server (vLLM,
    llama.cpp, TGI, a hosted API) from top-k logprobs or sampled answers. Its ~150 lines are the ScoringBackend
    protocol's members, the probe of the server's scoring mode and the requests of both modes (logprobs, samples);
    the HTTP client, the request cache, usage and the reading of answers are modules of their own."""

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
        self.connection = ServerConnection(options, model_id)
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
            async with self.connection.client() as client:
                return await self.connection.reply(client, asyncio.Semaphore(1), endpoint, body, cached=False)

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
        return self.connection.usage.to_dict(self.options.mode)

    def progress(self) -> dict[str, str]:
        used = self.connection.usage
        rate = used.requests / max(used.request_seconds, 1e-9)
        return {"req_per_s": f"{rate:.1f}", "retries": str(used.retries)}

    def take_usage(self) -> dict[str, Any]:
        taken, self.connection.usage = asdict(self.connection.usage), Usage()
        return taken

    def merge_usage(self, counters: dict[str, Any]) -> None:
        self.connection.usage.merge(counters)

    def letter_probs(self, prompts: Sequence[str]) -> np.ndarray:
        started = time.perf_counter()
        try:
            return run_to_completion(self._score_all(prompts))
        finally:
            self.connection.usage.request_seconds += time.perf_counter() - started

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
        async with self.connection.client() as client:
            async def one(prompt: str) -> np.ndarray:
                replies = await asyncio.gather(*(self.connection.reply(client, limit, endpoint, body)
                                                 for endpoint, body in self.requests_for(prompt)))
                return letter_probs_of(replies, self.options.mode, self.connection.usage)

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


