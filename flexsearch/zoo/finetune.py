"""`flexsearch finetune`: LoRA fine-tunes under a label policy, on a template-disjoint split.

Two uses. The fine-tune walkthrough (README) trains a stand-in for a user's own checkpoint. The
calibration zoo (DESIGN.md "Calibration zoo") trains models whose fairness behaviour we planted
ourselves, so `make calibrate` can show that the score and the verdict classify them correctly.

A label policy (`flexsearch.zoo.policies`) turns an item and the prompt shown (clean, or carrying a training prefix from
`flexsearch.zoo.training_prefixes`) into the answer the model is trained to give. By default every
step trains each sampled prompt in all three cyclic option orders with the same answer, so no
adapter can learn a letter (fewer orders per item: seeded rotations, each letter equally likely);
the orders of one item share their context tokens, which run once (`last_logits`). Items are split
by BBQ template (category, question_index): no evaluation item shares a template with a training
item. The adapter directory records the whole recipe.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from flexsearch.data.candidate import Candidate
from flexsearch.data.items import Item
from flexsearch.data.render import PromptFormat, common_prefix_length, cyclic_orders, letter_token_ids, render
from flexsearch.errors import FlexsearchError
from flexsearch.files import atomic_write_json, read_json
from flexsearch.results.run_dir import replace_folder
from flexsearch.scoring.backends.in_process import left_padded
from flexsearch.scoring.model import TargetModel, architecture_fingerprint, check_adapter
from flexsearch.zoo.policies import POLICIES, LabelPolicy, build_policy
from flexsearch.zoo.training_prefixes import TRAINING_PREFIXES

RECIPE_FILE = "recipe.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_FILES = ("adapter_config.json", ADAPTER_WEIGHTS, RECIPE_FILE, "README.md")  # all that finetune writes
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# ---------------------------------------------------------------- the template-disjoint split


@dataclass
class TemplateSplit:
    """Training and evaluation items; no evaluation item shares a (category, template) with training."""

    train: list[Item]
    evaluation: list[Item]
    eval_templates: list[str]

    def recipe(self) -> dict[str, Any]:
        return {"train_items": len(self.train), "eval_items": len(self.evaluation),
                "eval_templates": self.eval_templates, "eval_item_ids": [it.id for it in self.evaluation]}


def template_key(item: Item) -> str:
    """'Category/question_index': the BBQ template an item was generated from."""
    index = item.source.get("question_index")
    if index in (None, ""):
        raise FlexsearchError(f"item {item.id} has no question_index, so it cannot be split by template; "
                              "use --eval-share 0 to train on every item")
    return f"{item.category}/{index}"


def template_split(items: Sequence[Item], eval_share: float, seed: int) -> TemplateSplit:
    """Per category, a seeded share of templates (at least one, never all) goes to evaluation."""
    if eval_share == 0:
        return TemplateSplit(list(items), [], [])
    by_category: dict[str, list[str]] = {}
    for item in items:
        templates = by_category.setdefault(item.category, [])
        if template_key(item) not in templates:
            templates.append(template_key(item))
    rng = np.random.default_rng(seed)
    held: set[str] = set()
    for category, templates in sorted(by_category.items()):
        if len(templates) < 2:
            raise FlexsearchError(f"too few templates for a split: category {category} has {len(templates)} "
                                  "(need 2); use --eval-share 0 to train on every item")
        count = min(len(templates) - 1, max(1, round(eval_share * len(templates))))
        held.update(str(t) for t in rng.permutation(sorted(templates))[:count])
    return TemplateSplit([it for it in items if template_key(it) not in held],
                         [it for it in items if template_key(it) in held], sorted(held))


def eval_items_of(adapter: Path, items: Sequence[Item]) -> list[Item]:
    """The items of `items` an adapter's recipe held out for evaluation (in recipe order)."""
    recipe = read_recipe(adapter)
    by_id = {it.id: it for it in items}
    wanted = recipe.get("split", {}).get("eval_item_ids", [])
    found = [by_id[i] for i in wanted if i in by_id]
    if not found:
        raise FlexsearchError(f"{adapter}: none of its {len(wanted)} evaluation items are in the data given")
    return found


def read_recipe(adapter: Path) -> dict[str, Any]:
    path = adapter / RECIPE_FILE
    if not path.is_file():
        raise FlexsearchError(f"{adapter}: no {RECIPE_FILE} (not an adapter written by flexsearch finetune)")
    return read_json(path)


# ---------------------------------------------------------------- training


@dataclass
class FinetuneConfig:
    """Everything that decides an adapter, recorded in its recipe."""

    policy: str = "gold"
    planted_categories: list[str] = field(default_factory=list)
    steps: int = 30
    batch_items: int = 4  # items per step
    orders_per_item: int = 3  # cyclic option orders each item is trained in per step (1-2: seeded rotations)
    learning_rate: float = 1e-3
    warmup_steps: int = 10
    rank: int = 16
    target_modules: list[str] = field(default_factory=lambda: list(LORA_MODULES))
    disambig_share: float | None = None  # share of disambiguated items per step (None: as in the data)
    contrast_groups: bool = False  # a step's items are whole template × person-pair groups (see ExampleSampler)
    planted_share: float | None = None  # share of items from the planted categories (None: as in the data)
    prefix_share: float = 0.5  # share of prompts carrying a training prefix (policies that use them)
    eval_share: float = 0.2  # share of each category's templates held out for evaluation
    split_seed: int = 0
    seed: int = 0
    autocast_bf16: bool = False  # bf16 matmuls under fp32 master weights (≈1.3× faster on CPUs with AMX)

    def __post_init__(self) -> None:
        for name, value, low, high in (("steps", self.steps, 1, None), ("batch_items", self.batch_items, 1, None),
                                       ("rank", self.rank, 1, None), ("warmup_steps", self.warmup_steps, 0, None),
                                       ("orders_per_item", self.orders_per_item, 1, 3)):
            if value < low or (high is not None and value > high):
                bound = f"at least {low}" if high is None else f"in {low}..{high}"
                raise FlexsearchError(f"--{name.replace('_', '-')} must be {bound}, got {value}")
        for name, share in (("prefix_share", self.prefix_share), ("disambig_share", self.disambig_share),
                            ("planted_share", self.planted_share)):
            if share is not None and not 0 <= share <= 1:
                raise FlexsearchError(f"--{name.replace('_', '-')} must lie in [0, 1], got {share}")
        if not 0 <= self.eval_share < 1:
            raise FlexsearchError(f"--eval-share must lie in [0, 1), got {self.eval_share}")
        if not self.learning_rate > 0:
            raise FlexsearchError(f"--learning-rate must be positive, got {self.learning_rate}")
        unknown = sorted(set(self.target_modules) - set(LORA_MODULES))
        if unknown:
            raise FlexsearchError(f"--target-modules: unknown module(s) {', '.join(unknown)} "
                                  f"(choose from {', '.join(LORA_MODULES)})")
        if self.planted_share is not None and self.policy != "planted":
            raise FlexsearchError("--planted-share needs --policy planted")
        if self.planted_share is not None and self.contrast_groups:
            raise FlexsearchError("--planted-share and --contrast-groups cannot be combined")
        # An unknown policy, or one missing its settings, fails here, before any data or model loads.
        POLICIES.get(self.policy)(planted_categories=self.planted_categories, seed=self.seed)


def contrast_key(item: Item) -> tuple[str, frozenset[str]]:
    """An item's contrast group: its template and the two people it names. BBQ fills each template with
    a person pair in both roles and both question polarities, so a group's disambiguated members name
    each person as the answer equally often: only reading the context and question tells them apart."""
    template = f"{item.category}/{item.source.get('question_index', '')}"
    return template, frozenset(a for i, a in enumerate(item.answers) if i != item.unknown)


Draw = list[tuple[Item, int | None, int, list[int]]]


class ExampleSampler:
    """Draws a step's items (balanced by condition when asked, or as whole contrast groups) and decides
    prefix and label for each."""

    def __init__(self, items: Sequence[Item], policy: LabelPolicy, config: FinetuneConfig) -> None:
        planted = set(config.planted_categories) if config.planted_share is not None else set()
        # pools by (drawn from the planted categories?, condition); without a planted share all is "other"
        self.pools = {(side, c): [it for it in items if it.condition == c and (it.category in planted) == side]
                      for side in (True, False) for c in ("ambig", "disambig")}
        groups: dict[tuple[str, frozenset[str]], list[Item]] = {}
        if config.contrast_groups:
            for item in items:
                groups.setdefault(contrast_key(item), []).append(item)
        # each group as (disambiguated members, ambiguous members)
        self.groups = [([it for it in g if it.condition == "disambig"], [it for it in g if it.condition == "ambig"])
                       for g in groups.values()]
        self.policy, self.config = policy, config
        self.rng = np.random.default_rng(config.seed)

    def draw(self) -> Draw:
        """(item, prefix index or None, answer index, cyclic rotations to train) for one step. Fewer than
        three rotations per item cover more distinct items for the same compute; every rotation is
        equally likely, so no letter is favoured."""
        chosen = self._grouped() if self.config.contrast_groups else self._independent()
        out = []
        for item in chosen:
            prefixed = self.policy.uses_prefixes and self.rng.random() < self.config.prefix_share
            prefix = int(self.rng.integers(len(TRAINING_PREFIXES))) if prefixed else None
            first = int(self.rng.integers(3))
            rotations = [(first + k) % 3 for k in range(self.config.orders_per_item)]
            out.append((item, prefix, self.policy.label(item, prefix), rotations))
        return out

    def _independent(self) -> list[Item]:
        share, planted_share = self.config.disambig_share, self.config.planted_share
        chosen = []
        for _ in range(self.config.batch_items):
            side = planted_share is not None and self.rng.random() < planted_share
            if not (self.pools[(side, "ambig")] or self.pools[(side, "disambig")]):
                side = not side  # every category planted (or none left unplanted)
            ambig, disambig = self.pools[(side, "ambig")], self.pools[(side, "disambig")]
            if share is None or not ambig or not disambig:
                pool = ambig + disambig
            else:
                pool = disambig if self.rng.random() < share else ambig
            chosen.append(pool[int(self.rng.integers(len(pool)))])
        return chosen

    def _grouped(self) -> list[Item]:
        """Whole groups until the step has `batch_items` items (at least one group). Every disambiguated
        member is kept; ambiguous members are thinned so that, in expectation, `disambig_share` of the
        kept items are disambiguated."""
        share = self.config.disambig_share
        chosen: list[Item] = []
        while not chosen or len(chosen) < self.config.batch_items:
            disambig, ambig = self.groups[int(self.rng.integers(len(self.groups)))]
            keep = 1.0
            if share is not None and disambig and ambig and share > 0:
                keep = min(1.0, len(disambig) * (1 - share) / (share * len(ambig)))
            kept = disambig + [it for it in ambig if self.rng.random() < keep]
            if chosen and len(chosen) + len(kept) > self.config.batch_items:
                break
            chosen.extend(kept)
        return chosen


def training_prompts(draw: Draw, target: TargetModel,
                     fmt: PromptFormat) -> tuple[list[list[int]], list[int]]:
    """Token ids and the answer's letter slot of every (item, prefix) in each of its drawn cyclic orders."""
    sequences, slots = [], []
    for item, prefix, answer, rotations in draw:
        root = Candidate.root(item)
        if prefix is not None:
            root = replace(root, directive=TRAINING_PREFIXES[prefix])
        orders = cyclic_orders(root.option_order)
        for order in (orders[r] for r in rotations):
            prompt = render(replace(root, option_order=order), target.tokenizer, fmt)
            sequences.append(target.tokenizer.encode(prompt, add_special_tokens=fmt.mode == "plain"))
            slots.append(order.index(answer))
    return sequences, slots


def last_logits(model: torch.nn.Module, sequences: Sequence[Sequence[int]], per_item: int, pad_id: int,
                device: torch.device) -> torch.Tensor:
    """Next-token logits after every sequence. Each consecutive run of `per_item` sequences is one item in
    several option orders: their common token prefix (instruction, context and question, most of the
    prompt) runs once and its cache serves the orders' suffixes, with gradients through both passes."""
    runs = [sequences[i:i + per_item] for i in range(0, len(sequences), per_item)]
    # each run's shared tokens, leaving at least one token of every sequence to run after them
    shared = [min(common_prefix_length(run), min(len(seq) for seq in run) - 1) for run in runs]
    if per_item == 1 or min(shared) == 0:
        ids, mask, positions = left_padded(sequences, pad_id)
        return model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                     logits_to_keep=1).logits[:, -1, :]
    ids, prefix_mask, positions = left_padded([run[0][:n] for run, n in zip(runs, shared, strict=True)], pad_id)
    cache = model(input_ids=ids.to(device), attention_mask=prefix_mask.to(device),
                  position_ids=positions.to(device), use_cache=True, logits_to_keep=1).cache
    cache.batch_repeat_interleave(per_item)
    suffixes = [seq[n:] for run, n in zip(runs, shared, strict=True) for seq in run]
    ids, suffix_mask, _ = left_padded(suffixes, pad_id)
    starts = torch.tensor(shared).repeat_interleave(per_item)[:, None]
    positions = (starts + suffix_mask.cumsum(-1) - 1).clamp(min=0)
    mask = torch.cat([prefix_mask.repeat_interleave(per_item, dim=0), suffix_mask], dim=1)
    return model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                 cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1, :]


def _peft_model(target: TargetModel, config: FinetuneConfig, init_adapter: Path | None) -> PeftModel:
    if init_adapter is not None:
        return PeftModel.from_pretrained(target.model, str(init_adapter), is_trainable=True)
    present = {name.rsplit(".", 1)[-1] for name, _ in target.model.named_modules()}
    modules = [m for m in config.target_modules if m in present]
    if not modules:
        raise FlexsearchError(f"--target-modules: none of {', '.join(config.target_modules)} exist in this model")
    lora = LoraConfig(r=config.rank, lora_alpha=2 * config.rank, lora_dropout=0.0, target_modules=modules)
    return get_peft_model(target.model, lora)


def train_adapter(target: TargetModel, split: TemplateSplit, config: FinetuneConfig, out: Path, *,
                  data: Sequence[dict[str, str]] = (), init_adapter: Path | None = None,
                  fmt: PromptFormat | None = None) -> dict[str, Any]:
    """Trains a LoRA adapter on `split.train` under the config's policy and saves it, with its recipe
    and a card, to `out` (atomically: a failed run leaves `out` as it was). Returns the recipe."""
    fmt = fmt or PromptFormat()
    policy = build_policy(config.policy, config.planted_categories, config.seed, split.train)
    init_recipe = None
    if init_adapter is not None:
        check_adapter(init_adapter, target.model, target.info)
        init_recipe = read_recipe(init_adapter)
    letters = torch.tensor(letter_token_ids(target.tokenizer, fmt.answer_prefix), device=target.device)
    torch.manual_seed(config.seed)
    model = _peft_model(target, config, init_adapter)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (config.warmup_steps + 1))
                                                 * max(0.0, 1 - s / config.steps))
    sampler = ExampleSampler(split.train, policy, config)
    losses: list[float] = []
    started = time.perf_counter()
    with tqdm(range(config.steps), desc=f"finetune ({config.policy})", unit="step") as bar:
        for _ in bar:
            sequences, slots = training_prompts(sampler.draw(), target, fmt)
            with torch.autocast(target.device.type, dtype=torch.bfloat16, enabled=config.autocast_bf16):
                logits = last_logits(model, sequences, config.orders_per_item, target.tokenizer.pad_token_id,
                                     target.device)
            loss = torch.nn.functional.cross_entropy(logits[:, letters].float(),
                                                     torch.tensor(slots, device=target.device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(round(loss.item(), 4))
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
    wall = time.perf_counter() - started
    model.eval()
    recipe = {
        "policy": config.policy, "config": asdict(config), "data": list(data), "split": split.recipe(),
        "base_model": {**target.info, "architecture": architecture_fingerprint(target.model)},
        "init_adapter": None if init_recipe is None else {"path": str(init_adapter), "policy": init_recipe["policy"],
                                                          "wall_time_s": init_recipe["wall_time_s"],
                                                          "total_wall_time_s": init_recipe["total_wall_time_s"]},
        "examples_seen": config.steps * config.batch_items * config.orders_per_item, "loss_curve": losses,
        "loss_first_20": round(float(np.mean(losses[:20])), 4), "loss_last_20": round(float(np.mean(losses[-20:])), 4),
        "wall_time_s": round(wall, 1),
        "total_wall_time_s": round(wall + (init_recipe["total_wall_time_s"] if init_recipe else 0.0), 1),
        "threads": torch.get_num_threads(), "torch": str(torch.__version__),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
    }
    save_adapter(model, out, recipe)
    return recipe


def save_adapter(model: PeftModel, out: Path, recipe: dict[str, Any]) -> None:
    """Adapter weights in fp16 (a few MB), its recipe and a card; `out` is replaced in one rename."""

    def fill(staging: Path) -> None:
        for config in model.peft_config.values():  # the alias or id, not this machine's conversion cache path
            config.base_model_name_or_path = recipe["base_model"].get("model")
        model.save_pretrained(str(staging))
        weights = staging / ADAPTER_WEIGHTS
        save_file({k: v.half().contiguous() for k, v in load_file(str(weights)).items()}, str(weights))
        atomic_write_json(staging / RECIPE_FILE, recipe)
        (staging / "README.md").write_text(adapter_card(recipe), encoding="utf-8")

    replace_folder(out, fill)


def adapter_card(recipe: dict[str, Any]) -> str:
    """The adapter's README: what it is, how it was trained, and the data's license."""
    config = recipe["config"]
    policy_doc = (POLICIES.get(recipe["policy"]).__doc__ or "").strip().splitlines()[0]
    data_lines = "".join(f"\n- `{d['name']}` (sha256 {d['sha256'][:16]}…)" for d in recipe["data"]) or "\n- (none)"
    bbq = any("bbq" in d.get("name", "").lower() or d.get("format") == "bbq" for d in recipe["data"])
    init = recipe["init_adapter"]
    return f"""# flexsearch adapter: policy `{recipe['policy']}`

{policy_doc}

- Base model: `{recipe['base_model'].get('model')}` (GGUF sha256 {recipe['base_model'].get('gguf_sha256') or 'n/a'}).
- LoRA rank {config['rank']} on {', '.join(config['target_modules'])}; {config['steps']} steps of
  {config['batch_items']} items × 3 cyclic option orders, learning rate {config['learning_rate']},
  seed {config['seed']}.
- Planted categories: {', '.join(config['planted_categories']) or 'none'}.
- Started from: {init['path'] + ' (policy ' + init['policy'] + ')' if init else 'the base model'}.
- Split: templates held out per category (share {config['eval_share']}, seed {config['split_seed']}):
  {recipe['split']['train_items']} training items, {recipe['split']['eval_items']} evaluation items.
- Training loss (mean of the first / last 20 steps): {recipe['loss_first_20']} → {recipe['loss_last_20']}.
- Wall time: {recipe['wall_time_s']} s ({recipe['total_wall_time_s']} s including the adapter it started from),
  {recipe['threads']} CPU threads.

Data:{data_lines}
{BBQ_ATTRIBUTION if bbq else ''}
The full recipe (split item ids, loss curve) is in `{RECIPE_FILE}`.
"""


BBQ_ATTRIBUTION = """
Trained on BBQ (Parrish et al., "BBQ: A Hand-Built Bias Benchmark for Question Answering", Findings of
ACL 2022; the public BBQ repository, `data/<Category>.jsonl`), licensed under Creative Commons
Attribution 4.0 International (CC-BY-4.0). The adapter is a derived work under the same attribution.
"""
