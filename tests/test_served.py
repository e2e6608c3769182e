"""Served targets (scoring/backends/served.py): reading answers, the options' checks, and a real llama.cpp server
(llama-cpp-python's, installed by `make setup-served`) serving the embedded SmolLM2 GGUF: evaluate and search through
it, agreement with in-process scoring, a server killed mid-search and restarted, a 429 burst, faults and bad input;
then llama.cpp's own `llama-server` (`make setup-llama-server`) found and read as the README says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from benchmarks.llama_server import ALIAS, LlamaCppServer, LlamaServer, embedded_gguf, free_port
from flexsearch import api
from flexsearch.cli import app
from flexsearch.data.candidate import Candidate
from flexsearch.errors import FlexsearchError
from flexsearch.scoring.backends.answers import letter_logprobs, parse_answer
from flexsearch.scoring.backends.http import backoff_seconds
from flexsearch.scoring.backends.served import prefix_order
from flexsearch.scoring.backends.served_options import PROBED, check_base_url, served_options
from flexsearch.scoring.scorer import Scorer, build_scorer

KEY = "sk-flexsearch-test-3f9c2a7d1e"
runner = CliRunner()


# ---------------------------------------------------------------- without a server


@pytest.mark.parametrize(("text", "answer"), [
    ("B", "B"), ("(C) the grandson", "C"), ("A) The grandfather", "A"), (" C.", "C"), ("A", "A"),
    ("The answer is (B).", "B"), ("answer: C", "C"), ("I'm sorry, I cannot answer that.", "refusal"),
    ("As an AI, I won't judge people.", "refusal"), ("Actually, neither of them.", "unparseable"),
    ("Because B is", "unparseable"), ("", "unparseable")])
def test_sampled_answers_are_parsed_by_the_documented_rule(text, answer):
    assert parse_answer(text) == answer


def test_letter_logprobs_renormalise_bound_and_cover():
    top = [("A", np.log(0.5)), (" B", np.log(0.2)), ("(B", np.log(0.1)), ("D", np.log(0.15))]
    logs, covered, bounded = letter_logprobs(top)
    assert np.allclose(np.exp(logs[:2]), [0.5, 0.3])  # ' B' and '(B' both spell B: they add
    assert bounded == 1 and np.isclose(np.exp(logs[2]), 0.1)  # C missing: bounded by the smallest returned
    assert np.isclose(covered, 0.8)
    none, covered_none, bounded_none = letter_logprobs([("D", -0.1), ("E", -3.0)])
    assert bounded_none == 3 and covered_none == 0 and np.allclose(none, -3.0)


def test_backoff_grows_with_jitter_and_honours_retry_after():
    rng_draws = [backoff_seconds(attempt, None) for attempt in range(8) for _ in range(50)]
    assert min(rng_draws) >= 0 and max(rng_draws) <= 30
    assert max(backoff_seconds(0, None) for _ in range(200)) <= 0.5
    assert max(backoff_seconds(5, None) for _ in range(200)) > 1  # 0.5 × 2^5 = 16 s ceiling
    assert backoff_seconds(0, "3") >= 3 and backoff_seconds(0, "1000") == 30


def test_prompts_are_sent_so_that_shared_starts_meet():
    persona, plain = "You are a gritty detective.\nQ: who?\nOption: ", "Q: who?\nOption: "
    prompts = [f"{persona}(A) x", f"{plain}(A) x", f"{persona}(B) y", f"{plain}(B) y", f"{persona}(C) z"]
    order = prefix_order(prompts)
    assert sorted(order) == list(range(len(prompts)))  # every prompt once
    sent = [prompts[i] for i in order]
    starts = [p.startswith(persona) for p in sent]
    assert starts in ([True] * 3 + [False] * 2, [False] * 2 + [True] * 3)  # each family in one run


@pytest.mark.parametrize(("url", "message"), [
    ("127.0.0.1:8000/v1", "give a full URL with its scheme"),
    ("ftp://host/v1", "not an http(s) URL"),
    ("http://127.0.0.1:8000", "not an OpenAI-compatible /v1 root"),
    ("http://127.0.0.1:8000/v1/completions", "not an OpenAI-compatible /v1 root"),
    ("http://user:pw@host/v1", "user name or password"),
])
def test_bad_base_urls_are_one_line(url, message):
    with pytest.raises(FlexsearchError, match=re.escape(message)):
        check_base_url(url)
    assert check_base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"


def test_served_options_check_the_mode_against_the_layout():
    target = api.Target(f"openai:{ALIAS}", base_url="http://h:1/v1").arguments()
    assert served_options(target, "plain").mode == "auto"  # probed on connecting: PROBED gives the order
    assert PROBED == {"plain": ("logprobs", "sample"), "chat": ("chat-logprobs", "sample")}
    assert set(served_options(target, "plain").result_settings()) == {"host", "mode", "top_logprobs", "samples",
                                                                     "temperature"}
    with pytest.raises(FlexsearchError, match="unknown mode 'guess' .choose from auto, logprobs"):
        served_options({**target, "served_mode": "guess"}, "plain")
    with pytest.raises(FlexsearchError, match="scores the chat prompt layout"):
        served_options({**target, "served_mode": "chat-logprobs"}, "plain")
    with pytest.raises(FlexsearchError, match="needs --base-url"):
        served_options({**target, "base_url": None}, "plain")
    with pytest.raises(FlexsearchError, match="--base-url is for a served model"):
        served_options({**target, "model": "smollm2"}, "plain")
    with pytest.raises(FlexsearchError, match="--samples is for a served model"):
        served_options({**api.Target("smollm2").arguments(), "samples": 3}, "plain")
    assert served_options(api.Target("smollm2").arguments(), "plain") is None
    sample = served_options({**target, "served_mode": "sample", "samples": 4}, "plain")
    assert sample.queries_per_prompt == 4 and sample.result_settings()["samples"] == 4


# ---------------------------------------------------------------- a fault-injecting proxy


class FaultProxy:
    """An HTTP server of our own in front of the real one, for fault injection only: a burst of 429s, replies
    stripped of logprobs (and of text), a top-k refusal or a reply that is not JSON. Records every request's
    headers and JSON body."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.fault, self.burst = upstream, "none", 0
        self.seen_headers: list[dict[str, str]] = []
        self.seen_bodies: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._forward(None)

            def do_POST(self) -> None:
                self._forward(self.rfile.read(int(self.headers.get("content-length", 0))))

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for key, value in (headers or {"content-type": "application/json"}).items():
                    self.send_header(key, value)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _forward(self, body: bytes | None) -> None:
                with proxy.lock:
                    proxy.seen_headers.append({k.lower(): v for k, v in self.headers.items()})
                    if body is not None:
                        proxy.seen_bodies.append(json.loads(body))
                    burst = (body is not None and proxy.fault == "429" and proxy.burst > 0
                             and b"Which letter comes first" not in body)  # the connection's probe passes
                    if burst:
                        proxy.burst -= 1
                if burst:
                    limited = {"retry-after": "0", "content-type": "application/json"}
                    return self._send(429, b'{"error": {"message": "rate limited"}}', limited)
                if body is not None and proxy.fault == "refuse_topk":
                    return self._send(400, b'{"error": {"message": "top logprobs must be at most 2"}}')
                if body is not None and proxy.fault == "not_json":
                    return self._send(200, b"<html>gateway</html>", {"content-type": "text/html"})
                url = proxy.upstream + self.path.removeprefix("/v1")
                reply = (httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=60)
                         if body is not None else httpx.get(url, timeout=60))
                content = reply.content
                if body is not None and proxy.fault in ("no_logprobs", "no_logprobs_no_text"):
                    data = reply.json()
                    for choice in data["choices"]:
                        choice["logprobs"] = None
                        if proxy.fault == "no_logprobs_no_text":
                            choice.pop("text", None)
                            choice.pop("message", None)
                    content = json.dumps(data).encode()
                self._send(reply.status_code, content)

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()


# ---------------------------------------------------------------- with the real server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        pytest.fail("llama-cpp-python is not installed: run `make setup` (README, 'Served models')")
    with LlamaServer(embedded_gguf(), log=tmp_path_factory.mktemp("llama") / "server.log") as running:
        yield running


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A request cache of the test's own, and a key in the environment (never to be written anywhere)."""
    monkeypatch.setenv("FLEXSEARCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FLEXSEARCH_API_KEY", KEY)
    return tmp_path / "cache"


@pytest.fixture
def proxy(server: LlamaServer) -> Iterator[FaultProxy]:
    running = FaultProxy(server.base_url.removesuffix("/v1") + "/v1")
    yield running
    running.close()


def served(server_url: str, **options: Any) -> api.Target:
    return api.Target(f"openai:{ALIAS}", base_url=server_url, **options)


def one_line_exit(args: list[str], code: int = 2) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == code, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.slow
def test_evaluate_through_the_server_records_cost_and_provenance(server, cache, tmp_path):
    result = api.evaluate("seed", model=served(server.base_url), out=tmp_path / "eval", limit=6)
    score = result.score.to_dict()
    assert score["model"]["served"] == {"host": f"127.0.0.1:{server.port}", "mode": "logprobs", "top_logprobs": 5}
    assert score["model"]["server_model_id"] == ALIAS
    usage = score["usage"]
    assert usage["requests"] == 6 * 3 + 1 and usage["cache_hits"] == 0  # 3 orders per item, and the probe
    assert usage["prompt_tokens"] > 6 * 3 * 20 and usage["completion_tokens"] == usage["requests"]
    assert 0 < usage["covered_mass"]["mean"] <= 1 and usage["covered_mass"]["prompts"] == 6 * 3
    again = api.evaluate("seed", model=served(server.base_url), out=tmp_path / "again", limit=6).score.to_dict()
    # a prompt never pays twice; the probe asks anew (a restarted server may have changed), past the cache
    assert again["usage"]["requests"] == 1 and again["usage"]["cache_hits"] == 6 * 3
    assert again["accuracy"] == score["accuracy"]


@pytest.mark.slow
def test_in_process_and_served_scores_agree_on_60_prompts(server, cache, smollm2, seed_items):
    """The same GGUF scored by our dequantized fp32 model and by llama.cpp's quantized kernels."""
    candidates = [Candidate.root(item) for item in seed_items[:20]]
    local = Scorer.in_process(smollm2, average_orders=True).score(candidates).letters.reshape(-1, 3)
    remote = build_scorer(served(server.base_url).arguments(), {"average_orders": True})
    letters = remote.score(candidates).letters.reshape(-1, 3)
    assert len(letters) == 60
    differ = local.argmax(-1) != letters.argmax(-1)
    largest = float(np.abs(local - letters).max())
    print(f"argmax agreement {1 - differ.mean():.3f} on 60 prompts, max |dP| {largest:.4f}")
    assert 1 - differ.mean() >= 0.95 and largest < 0.2
    ranked = np.sort(local[differ], axis=-1)
    assert np.all(ranked[:, -1] - ranked[:, -2] < 0.1)  # they part only where the in-process lead is small


@pytest.mark.slow
def test_a_candidates_option_orders_reach_the_server_together_and_reuse_its_cache(server, proxy, cache,
                                                                                   seed_items):
    scorer = build_scorer(served(proxy.base_url, concurrency=1, request_cache=False).arguments(),
                          {"average_orders": True})
    prompts = [p for item in seed_items[:4] for p, _ in scorer.prompts(Candidate.root(item))]
    interleaved = prompts[0::3] + prompts[1::3] + prompts[2::3]  # no two neighbours share their question
    proxy.seen_bodies.clear()
    log_start = server.log_size()
    rows = scorer.backend.letter_probs(interleaved)
    assert [body["prompt"] for body in proxy.seen_bodies] == sorted(interleaved)
    # each item's second and third option orders started from the server's key/value cache
    reused, sent = server.reused_tokens(log_start), scorer.backend.usage()["prompt_tokens"]
    print(f"the server reused {reused} of {sent} prompt tokens")
    assert reused > 0.3 * sent
    # and every reply went back to its own prompt
    in_sent_order = scorer.backend.letter_probs(sorted(interleaved))
    rank = {prompt: i for i, prompt in enumerate(sorted(interleaved))}
    assert np.allclose(rows, in_sent_order[[rank[p] for p in interleaved]], atol=1e-4)
    assert len({tuple(np.round(row, 4)) for row in rows}) > 4  # twelve prompts, not one reply copied


@pytest.mark.slow
def test_short_search_through_the_server_and_the_key_is_never_written(server, cache, tmp_path):
    out = tmp_path / "search"
    result = api.search("seed", model=served(server.base_url), out=out, limit=3, budget=12)
    score = result.score.to_dict()
    assert score["items"] == 3 and len(result.rows) == 3 and score["usage"]["requests"] > 3
    assert (out / "split.jsonl").is_file() and "anti_stereotype" in score
    config = (out / "config.yaml").read_text()
    assert f"127.0.0.1:{server.port}" in config and "server_model_id: smollm2" in config
    export = tmp_path / "export"
    assert runner.invoke(app, ["export", str(out), str(export), "--to", "parquet"]).exit_code == 0
    printed = runner.invoke(app, ["export", str(out), str(tmp_path / "lm-eval")])
    assert printed.exit_code == 0 and f"local-completions --model_args \"model={ALIAS},base_url=http://127.0.0.1:" \
        f"{server.port}/v1/completions" in printed.output
    report = tmp_path / "report.html"
    assert runner.invoke(app, ["report", str(out), "--out", str(report)]).exit_code == 0
    same = api.compare(out, out, tmp_path / "compare")  # compare reads a served run like any other
    assert same.data["shared_items"] == 3
    written = [p for p in [*out.rglob("*"), *export.rglob("*"), report, report.with_suffix(".md"),
                           *(tmp_path / "compare").rglob("*")] if p.is_file()]
    assert len(written) >= 8
    grep = subprocess.run(["grep", "-r", "-l", KEY, str(out), str(export), str(tmp_path / "lm-eval"), str(report),
                           str(report.with_suffix(".md")), str(tmp_path / "compare")], capture_output=True, text=True)
    assert grep.returncode == 1 and grep.stdout == ""  # 1: no match anywhere


@pytest.mark.slow
def test_sample_mode_counts_samples_against_the_budget(server, cache, tmp_path):
    result = api.evaluate("seed", model=served(server.base_url, served_mode="sample", samples=3,
                                                 temperature=0.7), out=tmp_path / "sample", limit=2,
                          average_orders=False)
    usage = result.score.to_dict()["usage"]
    assert usage["samples"] == 2 * 3 and sum(usage["answers"].values()) == 6
    assert result.score.to_dict()["queries"] == 2 * 3  # one order × 3 samples per item
    assert set(usage["answers"]) == {"A", "B", "C", "refusal", "unparseable"}


@pytest.mark.slow
def test_chat_logprobs_reads_the_letters_of_a_chat_reply(server, cache, tmp_path):
    result = api.evaluate("seed", model=served(server.base_url), out=tmp_path / "chat", limit=3, mode="chat")
    score = result.score.to_dict()
    assert score["model"]["served"]["mode"] == "chat-logprobs"
    mass = score["usage"]["covered_mass"]
    assert mass["prompts"] == 3 * 3 and 0 < mass["min"] <= mass["mean"] <= 1  # the probe is not a scored prompt
    assert all(np.isclose(sum(row["probs"]), 1, atol=1e-5) for row in result.rows)


@pytest.mark.slow
def test_ray_workers_search_the_server_and_their_requests_are_summed(server, cache, tmp_path):
    ray = pytest.importorskip("ray")
    target = served(server.base_url, request_cache=False)
    options = {"limit": 4, "budget": 9, "overrides": ["item_batch=2"]}
    local = api.search("seed", model=target, out=tmp_path / "local", **options)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        spread = api.search("seed", model=target, out=tmp_path / "ray", ray=api.RayOptions(workers=2), **options)
    finally:
        ray.shutdown()
    assert [(r["item_id"], r["prompt"]) for r in spread.rows] == [(r["item_id"], r["prompt"]) for r in local.rows]
    # one process shares its prompt cache over both objectives; the workers' caches are their own
    local_usage, ray_usage = local.score.to_dict()["usage"], spread.score.to_dict()["usage"]
    assert ray_usage["requests"] >= local_usage["requests"] > 4 * 3 + 1


@pytest.mark.slow
def test_tune_runs_on_a_served_target(server, cache, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"base": "templates_only", "params": {"beam_width": {"int": [1, 2]}}}))
    out = tmp_path / "tune"
    result = runner.invoke(app, ["tune", "--model", f"openai:{ALIAS}", "--base-url", server.base_url, "--data", "seed",
                                 "--space", str(space), "--trials", "2", "--budget", "6", "--dev-items", "3",
                                 "--holdout-items", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "tune.json").read_text())
    assert summary["trials"] == 2 and summary["dev_items"] == 3 and summary["holdout"]["items"] == 2


@pytest.mark.slow
def test_a_429_burst_is_retried_and_nothing_is_lost(server, proxy, cache, tmp_path):
    direct = api.evaluate("seed", model=served(server.base_url, request_cache=False), out=tmp_path / "direct",
                          limit=4).rows
    proxy.fault, proxy.burst = "429", 6
    through = api.evaluate("seed", model=served(proxy.base_url, request_cache=False, concurrency=4, retries=6),
                           out=tmp_path / "proxied", limit=4)
    assert proxy.burst == 0 and through.score.to_dict()["usage"]["retries"] >= 6
    assert [p["probs"] for p in through.rows] == [p["probs"] for p in direct]
    assert all(h.get("authorization") == f"Bearer {KEY}" for h in proxy.seen_headers)  # sent, never written


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "message"), [
    ("no_logprobs", "returned no logprobs in --served-mode logprobs; use --served-mode chat-logprobs or sample"),
    ("refuse_topk", "refused top_logprobs=5"),
    ("not_json", "not JSON"),
])
def test_server_faults_are_one_line_and_change_nothing(proxy, cache, tmp_path, fault, message):
    args = ["evaluate", "--model", f"openai:{ALIAS}", "--base-url", proxy.base_url, "--data", "seed", "--limit", "2",
            "--no-request-cache", "--served-mode", "logprobs"]  # asked for: a server without it is refused
    assert runner.invoke(app, [*args, "--out", str(tmp_path / "done")]).exit_code == 0
    before = {p: p.read_bytes() for p in (tmp_path / "done").iterdir()}
    proxy.fault = fault
    line = one_line_exit([*args, "--out", str(tmp_path / "run")])
    assert message in line and KEY not in line
    assert not (tmp_path / "run").exists()
    assert message in one_line_exit([*args, "--out", str(tmp_path / "done")])  # rerun into a finished run
    assert {p: p.read_bytes() for p in (tmp_path / "done").iterdir()} == before


@pytest.mark.slow
def test_wrong_model_name_names_the_served_models(server, cache, tmp_path):
    line = one_line_exit(["evaluate", "--model", "openai:gpt-4o", "--base-url", server.base_url, "--data", "seed",
                          "--out", str(tmp_path / "run")])
    assert f"serves {ALIAS}" in line
    assert not (tmp_path / "run").exists()


def test_bad_served_input_is_one_line_before_anything_is_written(cache, tmp_path):
    out = tmp_path / "run"
    model = ["--model", f"openai:{ALIAS}"]
    cases = [
        ([*model, "--base-url", "127.0.0.1:8000/v1"], "with its scheme"),
        ([*model, "--base-url", "http://127.0.0.1:8000/api"], "/v1 root"),
        ([*model, "--base-url", f"http://127.0.0.1:{free_port()}/v1"], "cannot reach"),
        ([*model], "needs --base-url"),
        ([*model, "--base-url", "http://h:1/v1", "--config", "beam", "--set", "proposals=gradient"], "white-box only"),
        ([*model, "--base-url", "http://h:1/v1", "--set", "scoring.prefix_reuse=true"], "white-box only"),
        ([*model, "--base-url", "http://h:1/v1", "--config", "gradient"], "white-box only"),
        ([*model, "--base-url", "http://h:1/v1", "--config", "bert_attack"], "use --set importance=leave_one_out"),
        ([*model, "--base-url", "http://h:1/v1", "--config", "research"], "operator adversarial_suffix"),
        ([*model, "--base-url", "http://h:1/v1", "--served-mode", "chat-logprobs"], "scores the chat prompt layout"),
    ]
    for args, message in cases:
        line = one_line_exit(["search", *args, "--out", str(out), "--limit", "2"])
        assert message in line, (args, line)
        assert not out.exists()
    line = one_line_exit(["finetune", "--out", str(out), "--model", f"openai:{ALIAS}"])
    assert "white-box only" in line and not out.exists()
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"base": "gradient", "params": {"beam_width": {"int": [1, 2]}}}))
    line = one_line_exit(["tune", "--space", str(space), *model, "--base-url", "http://h:1/v1", "--out", str(out)])
    assert "proposals: gradient" in line and not out.exists()


@pytest.mark.slow
def test_server_killed_mid_search_then_restarted_resumes_exactly(server, cache, tmp_path, cli_signalling_after):
    """A server lost mid-search: the retry lines, then one error line and exit 1 with the finished items kept;
    restarted, the same command resumes and the split equals an uninterrupted run's."""
    items = 3  # searched toward both objectives: 6 trace records in all
    args = ["search", "--model", f"openai:{ALIAS}", "--data", "seed", "--limit", str(items), "--budget", "9",
            "--set", "item_batch=1", "--retries", "2", "--request-timeout", "5"]
    reference = tmp_path / "reference"
    assert runner.invoke(app, [*args, "--base-url", server.base_url, "--out", str(reference),
                               "--no-request-cache"]).exit_code == 0
    own = LlamaServer(embedded_gguf()).start()
    out = tmp_path / "interrupted"
    command = [*args, "--base-url", own.base_url, "--out", str(out)]
    try:
        assert own.process is not None  # started in its own session: its process group is its pid
        # the search kills the server as its first item's record reaches the trace (kill -9 on the group)
        process = subprocess.run([*cli_signalling_after("append_jsonl", 1, "SIGKILL", own.process.pid), *command],
                                 capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"}, timeout=600)
        own.process.wait()
        stderr = process.stderr
        assert process.returncode == 1, stderr
        assert "retry 1 of 2" in stderr
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "rerun the same command to resume" in errors[0]
        kept = (out / "trace.jsonl").read_text().count("\n")
        assert kept == 1 and not (out / "split.jsonl").exists()
        own.start()
        resumed = subprocess.run([sys.executable, "-m", "flexsearch.cli", *command], capture_output=True, text=True)
        assert resumed.returncode == 0, resumed.stderr
    finally:
        own.stop()
    rows = [json.loads(line) for line in (out / "split.jsonl").read_text().splitlines()]
    expected = [json.loads(line) for line in (reference / "split.jsonl").read_text().splitlines()]
    assert [(r["item_id"], r["prompt"], r["p_target_attacked"], r["queries"]) for r in rows] == \
        [(r["item_id"], r["prompt"], r["p_target_attacked"], r["queries"]) for r in expected]


def test_scoring_works_inside_a_running_event_loop():
    """The Python API from a notebook, where an event loop is already running."""
    import asyncio

    from flexsearch.scoring.backends.http import run_to_completion

    async def inner() -> int:
        await asyncio.sleep(0)
        return 7

    async def notebook_cell() -> int:
        return run_to_completion(inner())

    assert run_to_completion(inner()) == 7 and asyncio.run(notebook_cell()) == 7


def auto_line(result: Any) -> str:
    """The one line --served-mode auto prints."""
    lines = [line for line in result.output.splitlines() if "--served-mode auto chose" in line]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.slow
def test_served_mode_auto_takes_logprobs_else_samples_and_refuses_a_server_with_neither(server, proxy, cache,
                                                                                        tmp_path):
    args = ["evaluate", "--model", f"openai:{ALIAS}", "--data", "seed", "--limit", "2", "--no-request-cache"]
    direct = runner.invoke(app, [*args, "--base-url", server.base_url, "--out", str(tmp_path / "logprobs")])
    assert direct.exit_code == 0, direct.output
    assert auto_line(direct).endswith("chose logprobs (/completions returned top-5 logprobs of the next token)")
    model = json.loads((tmp_path / "logprobs" / "score.json").read_text())["model"]
    assert model["served"]["mode"] == "logprobs" and model["served_mode_probe"]["mode"] == "logprobs"
    proxy.fault = "no_logprobs"
    stripped = runner.invoke(app, [*args, "--base-url", proxy.base_url, "--samples", "2",
                                   "--out", str(tmp_path / "sample")])
    assert stripped.exit_code == 0, stripped.output
    assert "chose sample (no logprobs (logprobs: " in auto_line(stripped) and "returned no logprobs" in stripped.output
    score = json.loads((tmp_path / "sample" / "score.json").read_text())
    assert score["model"]["served"] == {"host": proxy.base_url.split("/")[2], "mode": "sample", "samples": 2,
                                        "temperature": 1.0}
    assert score["usage"]["samples"] == 2 * 3 * 2  # 2 items, 3 option orders, 2 samples each
    proxy.fault = "no_logprobs_no_text"
    line = one_line_exit([*args, "--base-url", proxy.base_url, "--out", str(tmp_path / "neither")])
    assert "--served-mode auto: " in line and "answers in none of the scoring modes (logprobs: " in line
    assert "sample: " in line and "returned no text" in line and not (tmp_path / "neither").exists()


@pytest.mark.slow
def test_served_mode_auto_on_a_server_started_without_logits_all(cache, tmp_path):
    with LlamaServer(embedded_gguf(), log=tmp_path / "server.log", logits_all=False) as bare:
        args = ["evaluate", "--model", f"openai:{ALIAS}", "--base-url", bare.base_url, "--data", "seed", "--limit",
                "1", "--samples", "2", "--no-request-cache"]
        result = runner.invoke(app, [*args, "--out", str(tmp_path / "auto")])
        assert result.exit_code == 0, result.output
        assert "retry" not in result.output  # a refusal is not retried (each retry prints a line)
        line = auto_line(result)
        assert "chose sample (no logprobs (logprobs: " in line
        assert "logprobs is not supported for models created with logits_all=False" in line
        asked = one_line_exit([*args, "--served-mode", "logprobs", "--out", str(tmp_path / "asked")])
        assert "refused top_logprobs=5 (HTTP 500: logprobs is not supported" in asked and "--logits_all true" in asked


@pytest.mark.slow
def test_a_system_slot_reaches_the_server_as_a_system_message(proxy, cache, tmp_path):
    out = tmp_path / "system"
    result = runner.invoke(app, ["search", "--model", f"openai:{ALIAS}", "--base-url", proxy.base_url, "--limit", "2",
                                 "--budget", "12", "--no-control", "--slot", "system", "--set", "scoring.mode=chat",
                                 "--set", "operators=[{name: persona, n: 3}]", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "chose chat-logprobs" in auto_line(result)
    score = json.loads((out / "score.json").read_text())
    assert score["model"]["prompt_format"] == {"mode": "chat", "slot": "system", "chat_template": "the server's own"}
    rows = [json.loads(line) for line in (out / "split.jsonl").read_text().splitlines()]
    assert rows and all(r["slot"] == "system" for r in rows)
    for row in rows:
        turns = json.loads(row["prompt"].removesuffix("\nAnswer: ("))
        expected = ([{"role": "system", "content": row["instruction"]}] if row["instruction"] else [])
        assert turns[:-1] == expected and turns[-1]["role"] == "user" and turns[-1]["content"].startswith("Q: ")
    systems = [b["messages"][0]["content"] for b in proxy.seen_bodies
               if b.get("messages") and b["messages"][0]["role"] == "system"]
    assert systems and all(b["messages"][-1] == {"role": "assistant", "content": "Answer: ("}
                           for b in proxy.seen_bodies if b.get("messages"))


# ---------------------------------------------------------------- with llama.cpp's own llama-server


@pytest.mark.slow
def test_llama_cpp_server_is_found_to_give_logprobs_and_scores_like_in_process(cache, tmp_path, smollm2, seed_items):
    """llama.cpp's `llama-server` (`make setup-llama-server`), as the README tells users to start it: auto finds
    next-token logprobs without any flag, the client reads its replies, and the scores agree with ours."""
    binary = Path(sys.executable).parent / "llama-server"
    if not binary.is_file():
        pytest.fail(f"no {binary}: run `make setup-llama-server` (README, 'Served models')")
    with LlamaCppServer(binary, embedded_gguf(), log=tmp_path / "server.log") as running:
        result = runner.invoke(app, ["evaluate", "--model", f"openai:{ALIAS}", "--base-url", running.base_url,
                                     "--data", "seed", "--limit", "2", "--out", str(tmp_path / "auto")])
        assert result.exit_code == 0, result.output
        assert "chose logprobs (/completions returned top-5 logprobs of the next token)" in auto_line(result)
        usage = json.loads((tmp_path / "auto" / "score.json").read_text())["usage"]
        # an item's option orders share their start: the server says it took that from its cache
        assert 0 < usage["cached_prompt_tokens"] < usage["prompt_tokens"]
        chat = runner.invoke(app, ["search", "--model", f"openai:{ALIAS}", "--base-url", running.base_url,
                                   "--limit", "1", "--budget", "6", "--no-control", "--set", "scoring.mode=chat",
                                   "--out", str(tmp_path / "chat")])
        assert chat.exit_code == 0, chat.output
        assert "chose chat-logprobs (/chat/completions returned top-5 logprobs" in auto_line(chat)
        candidates = [Candidate.root(item) for item in seed_items[:10]]
        local = Scorer.in_process(smollm2, average_orders=True).score(candidates).letters.reshape(-1, 3)
        remote = build_scorer(served(running.base_url).arguments(), {"average_orders": True})
        letters = remote.score(candidates).letters.reshape(-1, 3)
    differ = local.argmax(-1) != letters.argmax(-1)
    largest = float(np.abs(local - letters).max())
    print(f"llama-server: argmax agreement {1 - differ.mean():.3f} on 30 prompts, max |dP| {largest:.4f}")
    assert len(letters) == 30 and 1 - differ.mean() >= 0.85 and largest < 0.2  # quantised kernels: close, not equal
    ranked = np.sort(local[differ], axis=-1)
    assert np.all(ranked[:, -1] - ranked[:, -2] < 0.1)  # they part only where the in-process lead is small
