"""Rendering a candidate into the prompt the target model scores (DESIGN.md "Rendering")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flexsearch.candidate import Candidate
from flexsearch.errors import FlexsearchError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

LETTERS = ("A", "B", "C")
MODES = ("plain", "chat")


@dataclass(frozen=True)
class PromptFormat:
    """How prompts are laid out; part of every run's config."""

    mode: str = "plain"  # "plain": the bigbench-style text FLEX uses; "chat": wrapped in the chat template
    answer_prefix: str = "Answer: ("  # the option letter is read as the next token after this

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise FlexsearchError(f"unknown prompt mode '{self.mode}' (choose from {', '.join(MODES)})")


def question_block(candidate: Candidate) -> str:
    """The question and its options in the candidate's displayed order."""
    answers = candidate.item.answers
    options = "\n".join(
        f"({letter}) {answers[index]}" for letter, index in zip(LETTERS, candidate.option_order, strict=True)
    )
    return f"Q: {candidate.context} {candidate.question}\nOption: {options}"


def render(candidate: Candidate, tokenizer: PreTrainedTokenizerBase | None, fmt: PromptFormat) -> str:
    """The prompt text; the tokenizer (its chat template) is needed in chat mode only."""
    body = question_block(candidate)
    if candidate.instruction:
        body = f"{candidate.instruction}\n{body}"
    if fmt.mode == "plain":
        return f"{body}\n{fmt.answer_prefix}"
    if tokenizer is None or not tokenizer.chat_template:
        raise FlexsearchError("prompt mode 'chat' needs a tokenizer with a chat template; use mode 'plain'")
    opened = tokenizer.apply_chat_template(
        [{"role": "user", "content": body}], tokenize=False, add_generation_prompt=True
    )
    return f"{opened}{fmt.answer_prefix}"


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
