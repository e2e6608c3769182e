"""In-process scoring vs the same GGUF behind llama.cpp's OpenAI-compatible server (issue 26).

One embedded GGUF (SmolLM2-135M-Instruct, Q4_1), the seed set's clean prompts in their three option orders:
prompts/s in process (our fp32 dequantized model, the default preset's scoring) and through the server at
each concurrency, with the served scores' argmax agreement and largest |ΔP| against the in-process ones. Then
the default search on the first seed items at each budget, both ways: wall time, queries, requests, tokens, ASR
and verdict, and the share of prompt tokens the server took from its key/value cache (a prompt sharing its start
with the one before it: the search sends a round's prompts sorted, so a candidate's option orders go one after
another). Request caches are off, so every served prompt is paid for. Writes its section of RESULTS.md.

    python -m benchmarks.bench_served [--items 12] [--budgets 30 50] [--concurrency 1 2 4 8]
    python -m benchmarks.bench_served --llama-server .venv/bin/llama-server [--slots 1]   # llama.cpp's own server

The first serves the GGUF with llama-cpp-python's server (`make setup-served`), which needs logits for every
prompt position to return any logprobs; the second with llama.cpp's `llama-server` (`make setup-llama-server`),
which computes the last position's alone. Each writes its own section.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.common import record, roots, timed
from benchmarks.llama_server import ALIAS, LlamaCppServer, LlamaServer, embedded_gguf
from flexsearch import api
from flexsearch.config import load_config
from flexsearch.data.items import load_items
from flexsearch.scoring.backends.served import prefix_order
from flexsearch.scoring.model import load_target
from flexsearch.scoring.scorer import Scorer, build_scorer


def served_target(base_url: str, concurrency: int = 4) -> api.Target:
    return api.Target(f"openai:{ALIAS}", base_url=base_url, concurrency=concurrency, request_cache=False)


def throughput(server: LlamaServer, concurrency: list[int]) -> tuple[list[list[str]], list[str]]:
    items = load_items("seed").items
    scoring = load_config("default").scoring
    local_scorer = Scorer.from_config(load_target("smollm2", device="cpu"), scoring)
    prompts = [p for c in roots(items) for p, _ in local_scorer.prompts(c)]
    local, seconds = timed(lambda: local_scorer.backend.letter_probs(prompts))
    rows = [["in process (fp32, batch 16)", "-", f"{len(prompts) / seconds:.1f}", f"{seconds:.1f}", "1.000", "0"]]
    for level in concurrency:
        scorer = build_scorer(served_target(server.base_url, level).arguments(), {"average_orders": True})
        remote, seconds = timed(lambda scorer=scorer: scorer.backend.letter_probs(prompts))
        agree = np.mean(local.argmax(-1) == remote.argmax(-1))
        rows.append([f"llama.cpp server (Q4_1, {server.threads} threads)", str(level),
                     f"{len(prompts) / seconds:.1f}", f"{seconds:.1f}", f"{agree:.3f}",
                     f"{np.abs(local - remote).max():.3f}"])
    return rows, prompts


def prompt_lists(server: LlamaServer, prompts: list[str], sizes: tuple[int, ...] = (1, 8, 24),
                 concurrency: int = 4) -> list[list[str]]:
    """The clean prompts, sorted, sent straight to /completions `size` to a request (a prompt list above 1; llama-server
    answers one choice per prompt), `concurrency` requests at a time, after one unrecorded pass that warms the cache:
    seconds, choices, and the prompt and cached tokens the replies report."""
    ordered = [prompts[i] for i in prefix_order(prompts)]  # the client's own dispatch order

    async def send(size: int) -> tuple[float, list[dict[str, Any]]]:
        limit = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=300) as client:
            async def one(chunk: list[str]) -> dict[str, Any]:
                async with limit:
                    body = {"model": ALIAS, "prompt": chunk if size > 1 else chunk[0], "max_tokens": 1,
                            "temperature": 0.0, "logprobs": 5}
                    reply: dict[str, Any] = (await client.post("/completions", json=body)).json()
                    return reply
            chunks = [ordered[i : i + size] for i in range(0, len(ordered), size)]
            started = time.perf_counter()
            replies = await asyncio.gather(*map(one, chunks))
            return time.perf_counter() - started, list(replies)

    asyncio.run(send(1))
    rows = []
    for size in sizes:
        seconds, replies = asyncio.run(send(size))
        used = [r.get("usage") or {} for r in replies]
        rows.append([str(size), f"{seconds:.1f}", str(sum(len(r["choices"]) for r in replies)),
                     str(sum(u.get("prompt_tokens", 0) for u in used)),
                     str(sum((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) for u in used))])
    return rows


def search_cost(target: api.Target | str, items: int, budget: int, out: Path) -> tuple[dict[str, Any], float, str]:
    result, seconds = timed(lambda: api.search("seed", model=target, out=out, limit=items, budget=budget))
    return result.score.to_dict(), seconds, result.table


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=12)
    parser.add_argument("--budgets", type=int, nargs="+", default=[30, 50])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary to serve the GGUF with, "
                        "instead of llama-cpp-python's server")
    parser.add_argument("--slots", type=int, default=1, help="llama-server's --parallel (default 1, as the README "
                        "starts it)")
    args = parser.parse_args()
    threads = os.cpu_count() or 2
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "server.log"
        os.environ["FLEXSEARCH_CACHE"] = str(Path(scratch) / "cache")  # the converted GGUF is rebuilt once
        if args.llama_server:
            server: LlamaServer = LlamaCppServer(args.llama_server, embedded_gguf(), threads=threads, log=log,
                                                 slots=args.slots)
            served_by = (f"llama.cpp's own server (`llama-server --parallel {args.slots}`, built from the "
                         "llama.cpp that llama-cpp-python 0.3.36 vendors, its prompt cache on as by default)")
            title = "Served targets: in process vs llama.cpp's llama-server"
        else:
            server = LlamaServer(embedded_gguf(), threads=threads, log=log)
            served_by = "llama-cpp-python's server (`python -m llama_cpp.server --logits_all true`)"
            title = "Served targets: in process vs llama-cpp-python's server"
        with server:
            body = measured(args, server, Path(scratch))
    record(title, f"SmolLM2-135M-Instruct GGUF (Q4_1) in process (transformers dequantizes it to fp32) and behind "
                  f"{served_by}, {threads} threads, the same cores; request caches off.\n\n{body}")


def measured(args: argparse.Namespace, server: LlamaServer, scratch: Path) -> str:
    """Throughput, then the search at each budget in process and served: the section's tables."""
    rate_rows, prompts = throughput(server, args.concurrency)
    lists = prompt_lists(server, prompts) if isinstance(server, LlamaCppServer) else None
    search_rows, tables, walls = [], [], {}
    for budget in args.budgets:
        for name, target in (("in process", "smollm2"), ("served", served_target(server.base_url))):
            log_start = server.log_size()
            score, seconds, text = search_cost(target, args.items, budget, scratch / f"{name}-{budget}")
            walls[name, budget] = seconds
            usage = score.get("usage", {})
            # the server's own count where it reports one in its replies (llama-server), else its log's
            reused = (usage.get("cached_prompt_tokens") or server.reused_tokens(log_start)
                      if usage.get("prompt_tokens") else None)
            asr = score["stereotype"]["asr"]
            search_rows.append([
                name, str(budget), f"{seconds:.0f}", str(score["stereotype"]["queries"]["total"]
                                                      + score["anti_stereotype"]["queries"]["total"]),
                str(usage.get("requests", "-")), str(usage.get("prompt_tokens", "-")),
                str(usage.get("completion_tokens", "-")),
                f"{reused / usage['prompt_tokens']:.2f}" if reused is not None else "-",
                f"{asr['value']:.2f} [{asr['ci'][0]:.2f}, {asr['ci'][1]:.2f}] {asr['k']}/{asr['n']}",
                score["verdict"]["verdict"]])
            if name == "served" and budget == min(args.budgets):
                tables.append(f"The served search at budget {budget} as `flexsearch search` prints it:\n\n"
                              f"```\n{text}\n```")
    return "\n\n".join([
        f"**Scoring throughput**, {len(prompts)} prompts (the 72 seed items' clean prompts in 3 option orders), "
        "agreement of the served argmax with the in-process one and the largest |ΔP| over the three letters:",
        table(["scorer", "concurrency", "prompts/s", "seconds", "argmax agreement", "max abs dP"], rate_rows),
        *(["**Several prompts per request**: the same prompts, sorted, sent straight to /completions with `prompt` "
           "a list of this many (1: a string), four requests at a time, after a pass that warms the server's cache; "
           "the prompt and cached tokens the replies report:",
           table(["prompts per request", "seconds", "choices", "prompt tokens reported", "cached tokens reported"],
                 lists)] if lists else []),
        f"**Search cost**, the default preset on the first {args.items} seed items with the control (two objectives):",
        table(["target", "budget", "wall s", "queries", "requests", "prompt tokens", "completion tokens",
               "prompt tokens reused by the server", "ASR (stereotype)", "verdict"], search_rows),
        "Served wall time / in-process wall time: " + ", ".join(
            f"{walls['served', b] / walls['in process', b]:.2f}× at budget {b}" for b in args.budgets) + ".",
        *tables])


if __name__ == "__main__":
    main()
