"""Scoring throughput and hardware efficiency: flexsearch's one-pass scoring vs the peers' methods.

(a) lm-evaluation-harness style: log-likelihood of " (A)", " (B)", " (C)" as three separate
    continuations (how FLEX evaluates); (b) generate-and-parse: greedy generation of up to 8 tokens,
    and 5 sampled generations with a majority vote (how FLEX selected attacks), then read the letter.
All on the same BBQ prompts and model, in one run.

    python benchmarks/bench_scoring.py [--model smollm2] [--items 48] [--batch 16]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

import numpy as np
import torch

from benchmarks.common import bbq_items, markdown_table, matmul_flops, record, roots, timed
from flexsearch.data.render import LETTERS, PromptFormat, render
from flexsearch.scoring.backends.in_process import left_padded
from flexsearch.scoring.model import TargetModel, load_target
from flexsearch.scoring.scorer import Scorer

CONTINUATIONS = [f" ({letter})" for letter in LETTERS]
PLAIN_PREFIX = "Answer:"  # the peers read what follows "Answer:"; flexsearch scores after "Answer: ("
LETTER = re.compile(r"\(?\b([ABC])\b\)?")


def loglikelihood_choices(target: TargetModel, prompts: list[str], batch: int) -> np.ndarray:
    """Per prompt, the index of the continuation with the highest summed log-probability."""
    tok = target.tokenizer
    sequences, spans = [], []
    for prompt in prompts:
        context = tok.encode(prompt)
        for cont in CONTINUATIONS:
            full = tok.encode(prompt + cont)
            sequences.append(full)
            spans.append(len(full) - len(context))
    scores = []
    with torch.inference_mode():
        for start in range(0, len(sequences), batch):
            chunk, lengths = sequences[start : start + batch], spans[start : start + batch]
            ids, mask, positions = left_padded(chunk, tok.pad_token_id)
            keep = max(lengths) + 1
            logits = target.model(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                                  position_ids=positions.to(target.device), logits_to_keep=keep).logits.float()
            log_probs = torch.log_softmax(logits[:, :-1], -1)  # predicts positions -keep+1 .. -1
            for row, n in enumerate(lengths):
                tokens = ids[row, -n:].to(target.device)
                scores.append(float(log_probs[row, -n:].gather(-1, tokens[:, None]).sum()))
    return np.array(scores).reshape(len(prompts), 3).argmax(-1)


def generate_choices(target: TargetModel, prompts: list[str], batch: int, samples: int) -> tuple[list, int]:
    """Per prompt, the letter read from generated text (majority over samples) or None; parse failures."""
    tok = target.tokenizer
    choices, failures = [], 0
    with torch.inference_mode():
        for start in range(0, len(prompts), batch):
            chunk = prompts[start : start + batch]
            encoded = tok(chunk, return_tensors="pt", padding=True).to(target.device)
            out = target.model.generate(**encoded, max_new_tokens=8, do_sample=samples > 1,
                                        num_return_sequences=samples, pad_token_id=tok.pad_token_id,
                                        top_k=0 if samples > 1 else None)
            texts = tok.batch_decode(out[:, encoded["input_ids"].shape[1]:], skip_special_tokens=True)
            for k in range(len(chunk)):
                letters = [m.group(1) for t in texts[k * samples : (k + 1) * samples] if (m := LETTER.search(t))]
                failures += samples - len(letters)
                choices.append(LETTERS.index(Counter(letters).most_common(1)[0][0]) if letters else None)
    return choices, failures


def run(target: TargetModel, n_items: int, batch: int, title: str) -> None:
    items = bbq_items("Age", n_items) + bbq_items("Religion", n_items)[: n_items // 2]
    candidates = roots(items)
    scorer_fmt = PromptFormat()
    peer_prompts = [render(c, target.tokenizer, PromptFormat(answer_prefix=PLAIN_PREFIX)) for c in candidates]
    tokens = sum(len(target.tokenizer.encode(render(c, target.tokenizer, scorer_fmt))) for c in candidates)
    params = sum(p.numel() for p in target.model.parameters())
    embedding = target.model.get_input_embeddings().weight.numel()

    def ours() -> np.ndarray:
        return Scorer.in_process(target, batch_size=batch).score(candidates).probs.argmax(-1)  # a fresh cache each run

    ours_choice, t_ours = timed(ours, repeats=2)
    ll_choice, t_ll = timed(lambda: loglikelihood_choices(target, peer_prompts, batch))
    (greedy_choice, greedy_fail), t_greedy = timed(lambda: generate_choices(target, peer_prompts, batch, 1))
    (sample_choice, sample_fail), t_sample = timed(lambda: generate_choices(target, peer_prompts, batch, 5))
    n = len(candidates)

    def agree(other: list | np.ndarray) -> str:
        pairs = [(a, b) for a, b in zip(ours_choice, other, strict=True) if b is not None]
        return f"{np.mean([a == b for a, b in pairs]):.2f} (n={len(pairs)})" if pairs else "-"

    rows = [
        ["flexsearch one-pass", n / t_ours, 1.0, "-", "-"],
        ["(a) log-likelihood of 3 continuations", n / t_ll, t_ll / t_ours, agree(ll_choice), "0"],
        ["(b) generate 8 tokens, 1 greedy", n / t_greedy, t_greedy / t_ours, agree(greedy_choice),
         f"{greedy_fail / n:.2f}"],
        ["(b) generate 8 tokens, 5 samples", n / t_sample, t_sample / t_ours, agree(sample_choice),
         f"{sample_fail / (5 * n):.2f}"],
    ]
    achieved = 2 * params * tokens / t_ours
    dtype = next(target.model.parameters()).dtype
    peak = matmul_flops(dtype, device=str(target.device))
    body = (f"{n} BBQ prompts (Age + Religion), batch {batch}, {tokens / n:.0f} tokens per prompt on average.\n\n"
            + markdown_table(["method", "prompts/s", "flexsearch speed-up (x)", "same answer as flexsearch",
                              "letter parse failures"], rows)
            + f"\n\nHardware efficiency: 2·{params / 1e6:.0f}M params·{tokens} tokens / {t_ours:.2f} s = "
              f"{achieved / 1e9:.1f} GFLOP/s; dense {str(dtype).removeprefix('torch.')} matmul "
              f"{peak / 1e9:.1f} GFLOP/s → **{achieved / peak:.0%}** of measured peak. "
              f"(The formula counts the {embedding / 1e6:.0f}M-parameter embedding matrix for every token, "
              "although a lookup costs no multiply-adds and the output projection runs at the last position only.)")
    record(title, body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--items", type=int, default=48)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    run(load_target(args.model), args.items, args.batch, "Scoring throughput and hardware efficiency")


if __name__ == "__main__":
    main()
