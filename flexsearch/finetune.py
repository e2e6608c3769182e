"""A small LoRA fine-tune, so the "stress-test your fine-tuned checkpoint" walkthrough runs offline.

It teaches the model to pick each item's gold answer on the clean prompts (every cyclic option
order), which is what a fairness fine-tune aims for: "unknown" on ambiguous contexts, the evidence
on disambiguated ones. Real users bring their own checkpoint or adapter instead.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from tqdm.auto import tqdm

from flexsearch.candidate import Candidate
from flexsearch.items import Item
from flexsearch.model import TargetModel
from flexsearch.render import PromptFormat, cyclic_orders, render
from flexsearch.scoring import left_padded, letter_token_ids


def train_lora(target: TargetModel, items: Sequence[Item], out: Path, *, steps: int = 30, batch_size: int = 8,
               learning_rate: float = 1e-3, rank: int = 8, seed: int = 0,
               fmt: PromptFormat | None = None) -> dict[str, Any]:
    """Trains a LoRA adapter (q_proj, v_proj) on the items and saves it to `out` (atomically)."""
    fmt = fmt or PromptFormat()
    tokenizer = target.tokenizer
    letters = torch.tensor(letter_token_ids(tokenizer, fmt.answer_prefix))
    examples = []
    for item in items:
        root = Candidate.root(item)
        for order in cyclic_orders(root.option_order):
            prompt = render(replace(root, option_order=order), tokenizer, fmt)
            examples.append((tokenizer.encode(prompt, add_special_tokens=fmt.mode == "plain"), order.index(item.gold)))
    torch.manual_seed(seed)
    model = get_peft_model(target.model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                                    target_modules=["q_proj", "v_proj"]))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=learning_rate)
    rng = np.random.default_rng(seed)
    losses = []
    for _ in tqdm(range(steps), desc="finetune", unit="step"):
        batch = [examples[i] for i in rng.choice(len(examples), size=min(batch_size, len(examples)), replace=False)]
        ids, mask, positions = left_padded([seq for seq, _ in batch], tokenizer.pad_token_id)
        logits = model(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                       position_ids=positions.to(target.device), logits_to_keep=1).logits[:, -1, :]
        gold = torch.tensor([slot for _, slot in batch], device=target.device)
        loss = torch.nn.functional.cross_entropy(logits[:, letters.to(target.device)].float(), gold)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    model.save_pretrained(staging)
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return {"steps": steps, "examples": len(examples), "loss_first": round(losses[0], 4),
            "loss_last": round(losses[-1], 4)}
