"""Rendering a candidate into the prompt the target model scores (DESIGN.md "Rendering")."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flexsearch.data.candidate import Candidate
from flexsearch.errors import FlexsearchError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

LETTERS = ("A", "B", "C")
MODES = ("plain", "chat")
SLOTS = ("user", "system")  # where a chat prompt carries the attack's persona and instruction text
# why slot 'system' needs chat mode (PromptFormat and the config checks say it after what names the setting)
SYSTEM_NEEDS_CHAT = ("system puts the attack in a system message, which only chat prompts have: set scoring.mode "
                     "to chat (--set scoring.mode=chat, or --mode chat), or keep the slot user")


@dataclass(frozen=True)
class PromptFormat:
    """How prompts are laid out; part of every run's config."""

    mode: str = "plain"  # "plain": the bigbench-style text FLEX uses; "chat": wrapped in the chat template
    answer_prefix: str = "Answer: ("  # the option letter is read as the next token after this
    slot: str = "user"  # chat mode: the attack text opens the user turn ("user") or is the system message

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise FlexsearchError(f"unknown prompt mode '{self.mode}' (choose from {', '.join(MODES)})")
        if self.slot not in SLOTS:
            raise FlexsearchError(f"--slot: unknown slot '{self.slot}' (choose from {', '.join(SLOTS)})")
        if self.slot == "system" and self.mode != "chat":
            raise FlexsearchError(f"--slot {SYSTEM_NEEDS_CHAT}")


def question_block(candidate: Candidate) -> str:
    """The question and its options in the candidate's displayed order."""
    answers = candidate.item.answers
    options = "\n".join(
        f"({letter}) {answers[index]}" for letter, index in zip(LETTERS, candidate.option_order, strict=True)
    )
    return f"Q: {candidate.context} {candidate.question}\nOption: {options}"


def chat_turns(candidate: Candidate, slot: str) -> list[dict[str, str]]:
    """A chat prompt's messages: the question in the user turn, the attack text (persona, instruction, suffix)
    before it in the same turn, or (slot 'system') as a system message of its own. A clean prompt has no
    system message, so the template's own default system prompt, if it has one, stays."""
    body = question_block(candidate)
    if not candidate.instruction:
        return [{"role": "user", "content": body}]
    if slot == "system":
        return [{"role": "system", "content": candidate.instruction}, {"role": "user", "content": body}]
    return [{"role": "user", "content": f"{candidate.instruction}\n{body}"}]


def render(candidate: Candidate, tokenizer: PreTrainedTokenizerBase | None, fmt: PromptFormat) -> str:
    """The prompt text; the tokenizer (its chat template) is needed in chat mode only."""
    if fmt.mode == "plain":
        body = question_block(candidate)
        if candidate.instruction:
            body = f"{candidate.instruction}\n{body}"
        return f"{body}\n{fmt.answer_prefix}"
    if tokenizer is None or not tokenizer.chat_template:
        raise FlexsearchError("prompt mode 'chat' needs a tokenizer with a chat template; use mode 'plain'")
    opened = tokenizer.apply_chat_template(chat_turns(candidate, fmt.slot), tokenize=False, add_generation_prompt=True)
    return f"{opened}{fmt.answer_prefix}"


def chat_template_facts(tokenizer: PreTrainedTokenizerBase, model: str) -> dict[str, Any]:
    """What a run records of a chat template: its SHA-256 and whether it takes a system role (it renders a
    system message without raising, and the message's text is in what it renders)."""
    from jinja2 import TemplateError

    template = tokenizer.chat_template
    if not template:
        raise FlexsearchError(f"prompt mode 'chat': {model} has no chat template; use mode 'plain'")
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    marker = "flexsearch-system-role-check"
    try:
        rendered = tokenizer.apply_chat_template([{"role": "system", "content": marker},
                                                  {"role": "user", "content": "Q"}], tokenize=False,
                                                 add_generation_prompt=True)
        system_role = marker in rendered
    except TemplateError:  # templates that allow only user/assistant turns raise from inside the template
        system_role = False
    return {"chat_template_sha256": hashlib.sha256(text.encode()).hexdigest(), "system_role": system_role}


def format_facts(fmt: PromptFormat, tokenizer: PreTrainedTokenizerBase | None, model: str) -> dict[str, Any]:
    """How a run's prompts were laid out (score.json and config.yaml, under the model): the mode, the slot and,
    in chat mode, the template's hash and whether it takes a system role. A system slot on a template without
    one is refused in one line, before anything is scored."""
    facts: dict[str, Any] = {"mode": fmt.mode, "slot": fmt.slot}
    if fmt.mode == "chat" and tokenizer is not None:
        facts.update(chat_template_facts(tokenizer, model))
        if fmt.slot == "system" and not facts["system_role"]:
            raise FlexsearchError(f"--slot system: the chat template of {model} does not take a system role (it "
                                  "refuses one or drops its text); use --slot user")
    return facts


def word_spans(candidate: Candidate, prompt: str) -> dict[tuple[str, int], tuple[int, int]]:
    """Character span of every context and question word inside a rendered prompt."""
    start = prompt.rfind(question_block(candidate))
    if start < 0:
        raise ValueError("prompt was not rendered from this candidate")
    spans: dict[tuple[str, int], tuple[int, int]] = {}
    cursor = start + len("Q: ")
    for field_name in ("context", "question"):
        for position, word in enumerate(candidate.words(field_name)):
            spans[(field_name, position)] = (cursor, cursor + len(word))
            cursor += len(word) + 1
    return spans


def cyclic_orders(order: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    """The three rotations of an option order (cancel letter-position bias when averaged)."""
    return [(order[k % 3], order[(k + 1) % 3], order[(k + 2) % 3]) for k in range(3)]


def letter_token_ids(tokenizer, answer_prefix: str) -> list[int]:
    """The token that spells each option letter right after the answer prefix."""
    base = tokenizer.encode(answer_prefix, add_special_tokens=False)
    ids = []
    for letter in LETTERS:
        extended = tokenizer.encode(answer_prefix + letter, add_special_tokens=False)
        if extended[: len(base)] != base or len(extended) != len(base) + 1:
            raise FlexsearchError(
                f"option letter {letter!r} is not a single token after {answer_prefix!r} for this tokenizer; "
                "choose another answer_prefix (e.g. 'Answer:' to score ' A')"
            )
        ids.append(extended[-1])
    if len(set(ids)) != 3:
        raise FlexsearchError("the three option letters share a token")
    return ids


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every sequence shares (a prompt's option orders share everything before
    the options)."""
    limit = min(len(seq) for seq in sequences)
    shared = 0
    while shared < limit and all(seq[shared] == sequences[0][shared] for seq in sequences):
        shared += 1
    return shared
