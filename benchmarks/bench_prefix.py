"""Prefix key/value reuse and the dedup cache on a real search workload.

The workload is what a word-edit search scores: TextBugger edits of the question under a fixed
~300-token instruction (persona + competing objective) and a fixed context, proposals repeating as
a search revisits them. Scored once with prefix reuse + cache, once rescoring every full prompt.

    python benchmarks/bench_prefix.py [--model smollm2] [--items 4] [--edits 24]
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.common import bbq_items, markdown_table, record, timed
from flexsearch.attacks import OPERATORS, AttackResources, build
from flexsearch.attacks.templates import INSTRUCTION_FAMILIES, PERSONA_FAMILIES, fill
from flexsearch.data.candidate import Candidate
from flexsearch.data.render import PromptFormat, render
from flexsearch.scoring.model import TargetModel, load_target
from flexsearch.scoring.scorer import Scorer


def workload(n_items: int, edits: int, seed: int = 0) -> list[Candidate]:
    """Question edits under a long shared instruction; every third proposal repeats an earlier one."""
    rng = np.random.default_rng(seed)
    bugger = build(OPERATORS, {"name": "textbugger", "bugs": ["insert", "delete", "swap", "sub_c"],
                               "per_position": 4}, AttackResources())
    out: list[Candidate] = []
    for item in bbq_items("Age", n_items, condition="ambig"):
        # About 300 tokens of instruction: one persona per family and ten instructions.
        persona = " ".join(str(fill(family[0].text, item)) for family in PERSONA_FAMILIES.values())
        instructions = [t.text for family in INSTRUCTION_FAMILIES.values() for t in family]
        root = Candidate.root(item).with_slot("persona", "persona", persona).with_slot(
            "instruction", "directive", " ".join(instructions[:10]))
        positions = [("question", i) for i in range(len(root.question_words))]
        proposals: list[Candidate] = []
        while len(proposals) < edits:
            proposals += bugger.propose(root, rng, [positions[int(rng.integers(len(positions)))]])
        proposals = proposals[:edits]
        out += proposals + [proposals[int(k)] for k in rng.integers(0, len(proposals), edits // 3)]
    return out


def run(target: TargetModel, n_items: int, edits: int, batch: int, title: str) -> None:
    candidates = workload(n_items, edits)
    lengths = [len(target.tokenizer.encode(render(c, target.tokenizer, PromptFormat()))) for c in candidates]

    def full() -> np.ndarray:  # every prompt rescored in full, repeats included, no cache
        scorer = Scorer.in_process(target, batch_size=batch, prefix_reuse=False)
        return scorer.letter_probs_uncached([scorer.prompts(c)[0][0] for c in candidates])

    def reused() -> np.ndarray:
        return Scorer.in_process(target, batch_size=batch, prefix_reuse=True).score(candidates).letters[:, 0]

    base, t_full = timed(full)
    fast, t_fast = timed(reused)
    n = len(candidates)
    diff = float(np.abs(base - fast).max())
    rows = [["rescoring every full prompt", n / t_full, 1.0],
            ["prefix KV reuse + dedup cache", n / t_fast, t_full / t_fast]]
    body = (f"{n} prompts ({n_items} BBQ items × {edits} question edits + {edits // 3} repeats), "
            f"{np.mean(lengths):.0f} tokens on average, batch {batch}.\n\n"
            + markdown_table(["method", "effective prompts/s", "speed-up (x)"], rows)
            + f"\n\nLargest difference in P(letter) between the two: {diff:.2e} (target < 1e-4).")
    record(title, body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--items", type=int, default=4)
    parser.add_argument("--edits", type=int, default=24)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    run(load_target(args.model), args.items, args.edits, args.batch, "Prefix reuse on a search workload")


if __name__ == "__main__":
    main()
