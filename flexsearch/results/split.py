"""The emitted split: FLEX's columns and flexsearch's own, written and read back (the score computed
from it lives in flexsearch/results/metrics.py)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flexsearch.data.candidate import Candidate, in_place, replay, variant_id
from flexsearch.data.items import CONDITIONS, POLARITIES, Item, RecordFields, iter_csv, iter_jsonl
from flexsearch.data.render import LETTERS
from flexsearch.errors import InputError
from flexsearch.objectives import attack_eligible, get_objective

FLEX_COLUMNS = ["ctx", "q_text", "sent_more", "sent_less", "bias_type", "a", "b", "c", "label", "attack",
                "attack_type", "attack_success"]
OUR_COLUMNS = ["item_id", "prompt", "attack_chain", "p_target_clean", "p_target_attacked", "queries", "success",
               "objective", "instruction", "category", "condition", "polarity", "clean_ctx", "clean_q_text",
               "answers", "gold", "target", "anti_target", "unknown", "option_order", "natural", "forced_choice",
               "stereotyped_group", "slot", "chat_template_sha256"]
FAMILY_COLUMNS = ["family", "scored_orders"]  # the family split's own (split-families.*)
_LIST_COLUMNS = ("attack_chain", "answers", "option_order")
# FLEX's attack families (its `attack` column); every word-level operator is FLEX's "text" family.
FLEX_FAMILIES = {"persona": "persona", "instruction": "refusal_suppression"}
UNATTACKED = "none"


@dataclass
class Attacked:
    """One row of a split: the clean item and the attacked candidate, with recorded numbers."""

    item: Item
    candidate: Candidate
    record: dict[str, Any]


def flex_attack_label(candidate: Candidate) -> tuple[str, str]:
    """FLEX's `attack` (family names, '+'-joined in chain order for a composition) and `attack_type`:
    flexsearch's own variant ids as `operator:variant` (e.g. `persona:hostile.3+textbugger:swap`), a form
    no FLEX harness can mistake for its integer template indices; both name the edits the prompt holds (in_place: a
    template swapped out is in `attack_chain`, not here). `none` when unattacked."""
    edits = in_place(candidate.edits)
    if not edits:
        return UNATTACKED, UNATTACKED
    families = dict.fromkeys(FLEX_FAMILIES.get(e.operator, "text") for e in edits)
    return "+".join(families), "+".join(variant_id(e) for e in edits)


def split_row(outcome_record: dict[str, Any], item: Item, prompt: str,
              prompt_format: dict[str, Any]) -> dict[str, Any]:
    """One split row from a trace record. `success` is an attack success (objectives.attack_succeeded): never
    true on an item the clean model already answered with the target. `prompt_format` is the scorer's (where
    the attack text sat, the chat template's hash)."""
    candidate = replay(item, outcome_record["chain"], tuple(outcome_record["option_order"]))
    order = candidate.option_order
    attack, attack_type = flex_attack_label(candidate)
    objective = get_objective(outcome_record["objective"])
    aim = objective.target_answer(item)
    aim = item.target if aim is None else aim
    p_clean = outcome_record["clean_probs"][aim]
    p_attacked = outcome_record["best_probs"][aim]
    succeeded = bool(outcome_record["success"]) and attack_eligible(objective, item,
                                                                    np.asarray(outcome_record["clean_probs"]))
    return {
        "ctx": candidate.context, "q_text": candidate.question,
        "sent_more": item.answers[item.target], "sent_less": item.answers[item.anti_target],
        "bias_type": item.category.lower(),
        **{letter.lower(): item.answers[order[slot]] for slot, letter in enumerate(LETTERS)},
        "label": order.index(item.gold), "attack": attack, "attack_type": attack_type,
        "attack_success": round(p_attacked - p_clean, 6),
        "item_id": item.id, "prompt": prompt, "attack_chain": candidate.chain(),
        "p_target_clean": round(p_clean, 6), "p_target_attacked": round(p_attacked, 6),
        "queries": outcome_record["queries"], "success": succeeded,
        "objective": outcome_record["objective"], "instruction": candidate.instruction,
        "category": item.category, "condition": item.condition, "polarity": item.polarity,
        "clean_ctx": item.context, "clean_q_text": item.question, "answers": list(item.answers),
        "gold": item.gold, "target": item.target, "anti_target": item.anti_target, "unknown": item.unknown,
        "option_order": list(order), "natural": candidate.natural, "forced_choice": candidate.forced_choice,
        "stereotyped_group": item.stereotyped_group or "",
        "slot": prompt_format["slot"], "chat_template_sha256": prompt_format.get("chat_template_sha256", ""),
    }


def split_csv_text(rows: Sequence[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    family = FAMILY_COLUMNS if rows and "family" in rows[0] else []
    writer = csv.DictWriter(buffer, fieldnames=["", *FLEX_COLUMNS, *OUR_COLUMNS, *family], lineterminator="\n")
    writer.writeheader()
    for index, row in enumerate(rows):
        flat = {k: json.dumps(v) if k in _LIST_COLUMNS else v for k, v in row.items()}
        writer.writerow({"": index, **flat})
    return buffer.getvalue()


def load_split(path: Path, limit: int | None = None) -> list[Attacked]:
    """Rows of a split.jsonl or split.csv written by `flexsearch search`, rebuilt from their chains."""
    records = iter_csv(path) if path.suffix == ".csv" else iter_jsonl(path)
    out: list[Attacked] = []
    for line, record in records:
        if limit is not None and len(out) >= limit:
            break
        f = RecordFields(record, path, line)
        answers = f.json_value("answers")
        if not (isinstance(answers, list) and len(answers) == 3):
            raise f.error("answers", "expected a list of three answer texts")
        roles = {name: f.index(name) for name in ("gold", "unknown", "target", "anti_target")}
        if sorted((roles["unknown"], roles["target"], roles["anti_target"])) != [0, 1, 2]:
            raise f.error("target", "unknown, target and anti_target must name three different answers, got "
                                    f"{roles['unknown']}, {roles['target']}, {roles['anti_target']}")
        item = Item(id=f.text("item_id"), category=f.text("category"), context=f.text("clean_ctx"),
                    question=f.text("clean_q_text"), answers=tuple(answers), **roles,
                    condition=f.choice("condition", CONDITIONS), polarity=f.choice("polarity", POLARITIES),
                    source={"format": "split", "path": str(path), "line": line})
        order = f.json_value("option_order")
        if not (isinstance(order, list) and sorted(order) == [0, 1, 2]):
            raise f.error("option_order", f"expected a permutation of 0, 1, 2, got {order!r}")
        chain = f.json_value("attack_chain")
        if not isinstance(chain, list):
            raise f.error("attack_chain", "expected a list of edits")
        try:
            candidate = replay(item, chain, tuple(order))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise f.error("attack_chain", f"does not rebuild the prompt ({err})") from None
        out.append(Attacked(item, candidate, dict(record)))
    if not out:
        raise InputError(path, None, None, "no rows in split")
    return out
