"""Integration on the real embedded SmolLM2-135M-Instruct (marked slow; CI runs them)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flexsearch import api
from flexsearch.config import load_config
from flexsearch.data.candidate import Candidate
from flexsearch.results.split import load_split
from flexsearch.scoring.scorer import Scorer

pytestmark = pytest.mark.slow


def test_smollm2_scores_seed_items(smollm2, seed_items):
    scorer = Scorer.in_process(smollm2, batch_size=8)
    scores = scorer.score([Candidate.root(it) for it in seed_items[:6]])
    assert np.allclose(scores.probs.sum(-1), 1) and scorer.queries == 6
    assert scores.letters[:, 0].argmax(-1).tolist().count(0) >= 4  # the documented bias toward "A"


def test_smollm2_search_split_rescores(smollm2, tmp_path):
    config = load_config("default", ["operators=[{name: persona, n: 2}, {name: instruction, n: 2}]",
                                     "constraints=[protected_spans]"], budget=9, steps=1)
    out = tmp_path / "smol"
    table = api.search("seed", model=api.Target("smollm2", device="cpu"), out=out, config=config, limit=3).table
    assert "fairness gap" in table
    score = json.loads((out / "score.json").read_text())
    assert score["model"]["gguf_sha256"] and score["anti_stereotype"]["queries"]["mean"] <= 9
    rows = load_split(out / "split.jsonl")
    fresh = Scorer.in_process(smollm2, average_orders=True).score([r.candidate for r in rows]).probs
    for row, probs in zip(rows, fresh, strict=True):
        assert abs(probs[row.item.target] - row.record["p_target_attacked"]) < 1e-4


def test_lora_walkthrough_end_to_end(tmp_path):
    """README "Stress-test your fine-tuned checkpoint", shrunk: train, split on base, transfer, fresh split,
    compare both ways, report."""
    from typer.testing import CliRunner

    from flexsearch.cli import app

    runner = CliRunner()

    def ok(*args: str) -> str:
        result = runner.invoke(app, list(args))
        assert result.exit_code == 0, result.output
        return result.output

    adapter, base, transfer, tuned = (str(tmp_path / n) for n in ("lora", "base", "transfer", "tuned"))
    small = ["--data", "seed", "--limit", "4", "--budget", "6", "--set", "constraints=[protected_spans]",
             "--set", "operators=[{name: persona, n: 1}]"]
    assert "policy gold, 2 steps" in ok("finetune", "--model", "smollm2", "--data", "seed", "--limit", "4",
                                        "--steps", "2", "--batch-items", "1", "--eval-share", "0", "--out", adapter)
    ok("search", "--model", "smollm2", *small, "--out", base)
    ok("evaluate", "--split", f"{base}/split.jsonl", "--model", "smollm2", "--adapter", adapter, "--out", transfer)
    ok("search", "--model", "smollm2", "--adapter", adapter, *small, "--out", tuned)
    assert "shared items" in ok("compare", base, transfer)
    assert "shared items" in ok("compare", base, tuned)
    ok("report", base, tuned, "--out", str(tmp_path / "report.html"))
    transferred = json.loads((tmp_path / "transfer" / "score.json").read_text())
    assert transferred["model"]["adapter"].endswith("lora") and transferred["items"] == 4


def test_gradient_and_suffix_proposals_on_smollm2(smollm2, seed_items):
    """White-box proposals on a real model: gradient-guided word edits and suffix swaps stay within the
    budget, gradient passes are charged, and the suffix stays printable text of a fixed token length."""
    from flexsearch.engine.loop import build_context, run_search

    cheap = "constraints=[protected_spans, unique_positions, polarity_guard]"
    for preset, extra in (("gradient", []), ("research", ["operators=[{name: adversarial_suffix, length: 6}]",
                                                          "beam_width=1", "stop_on_success=false"])):
        config = load_config(preset, [cheap, *extra], budget=40, control=False)
        ctx = build_context(config, Scorer.in_process(smollm2, batch_size=8), "stereotype")
        outcomes = run_search(seed_items[:2], ctx, "stereotype")
        assert ctx.resources.gradient_passes >= 2 and all(o.queries <= 40 for o in outcomes)
        if preset == "research":
            width = len(smollm2.tokenizer.encode("! ! ! ! ! !", add_special_tokens=False))
            suffixed = [o.best for o in outcomes if o.best.suffix]
            assert suffixed and all(not c.natural and c.suffix.isascii() for c in suffixed)
            assert all(len(smollm2.tokenizer.encode(c.suffix, add_special_tokens=False)) == width for c in suffixed)
