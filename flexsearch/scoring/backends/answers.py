"""Reading a served model's answer: the option letters' probabilities from top-k logprobs, or the letter a sampled
answer states (a refusal or an answer naming no letter is neither)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from flexsearch.data.render import LETTERS
from flexsearch.scoring.backends.usage import Usage


def letter_logprobs(top: Sequence[tuple[str, float]]) -> tuple[np.ndarray, float, int]:
    """Log P of each option letter from one position's top-k (token, logprob) pairs.

    A token counts for a letter when, stripped of white space, a leading '(' and a trailing ')', '.' or ':', it
    is the letter (so 'A', ' A' and '(A' all count; their probabilities add). A letter missing from the top-k
    gets the smallest returned logprob, an upper bound on its own. Returns (log P per letter, covered mass =
    the letters' summed probability as returned, number of letters bounded)."""
    found: dict[str, float] = {}
    for token, logprob in top:
        core = token.strip().removeprefix("(").strip().rstrip(").:")
        if core in LETTERS:
            found[core] = float(np.logaddexp(found[core], logprob)) if core in found else float(logprob)
    floor = min((lp for _, lp in top), default=-math.inf)
    logs = np.array([found.get(letter, floor) for letter in LETTERS])
    covered = float(sum(math.exp(v) for v in found.values()))
    return logs, covered, 3 - len(found)


_REFUSAL = re.compile(r"\b(I\s+(cannot|can't|can not|won't|will not|am unable|'m unable|am not able)|I'm sorry|"
                      r"I am sorry|as an AI|I (do not|don't) feel comfortable)\b", re.IGNORECASE)


_LEADING_LETTER = re.compile(r"^\s*\(?\s*([ABC])\s*(\)|\.|:|,|$|\s)")


_STATED_LETTER = re.compile(r"\banswer\s*(?:is|would be)?\s*[:\-]?\s*\(?([ABC])\)?(?![A-Za-z])", re.IGNORECASE)


def parse_answer(text: str) -> str:
    """The option letter a sampled answer gives, 'refusal', or 'unparseable' (DESIGN.md "Served targets").

    In order: a letter the text starts with ('B', '(B) ...', 'C.' and, after the plain prompt's 'Answer: (',
    'A) ...'); a refusal ('I cannot...', "I'm sorry", 'as an AI'); a stated letter ('the answer is (C)');
    otherwise unparseable."""
    leading = _LEADING_LETTER.match(text)
    if leading:
        return leading.group(1)
    if _REFUSAL.search(text):
        return "refusal"
    stated = _STATED_LETTER.search(text)
    return stated.group(1) if stated else "unparseable"


def top_logprobs_of(choice: dict[str, Any]) -> list[tuple[str, float]]:
    """The first generated token's top-k (token, logprob) pairs, in either endpoint's shape: /completions'
    `top_logprobs` (a mapping per position), /chat/completions' `content[0].top_logprobs` (a list)."""
    logprobs = choice.get("logprobs") or {}
    if isinstance(logprobs.get("content"), list) and logprobs["content"]:
        return [(str(e.get("token", "")), float(e["logprob"])) for e in logprobs["content"][0].get("top_logprobs") or []
                if isinstance(e, dict) and e.get("logprob") is not None]
    top = logprobs.get("top_logprobs")
    if isinstance(top, list) and top and isinstance(top[0], dict):
        return [(str(token), float(lp)) for token, lp in top[0].items() if lp is not None]
    return []


def choice_text(choice: dict[str, Any]) -> str:
    message = choice.get("message")
    return str((message or {}).get("content") or "") if isinstance(message, dict) else str(choice.get("text") or "")


def letter_probs_of(replies: Sequence[dict[str, Any]], mode: str, used: Usage) -> np.ndarray:
    """P(A), P(B), P(C) from one prompt's replies (its `mode`), counting what they held in `used`."""
    if mode == "sample":
        answers = [parse_answer(choice_text(reply["choices"][0])) for reply in replies]
        for answer in answers:
            used.answers[answer] += 1
        counts = np.array([answers.count(letter) for letter in LETTERS], dtype=np.float64)
        if counts.sum() == 0:
            used.no_answer_prompts += 1
            return np.full(3, 1 / 3)
        return counts / counts.sum()
    logs, covered, bounded = letter_logprobs(top_logprobs_of(replies[0]["choices"][0]))
    used.covered_mass.append(covered)
    used.bounded_prompts += bounded > 0
    weights = np.exp(logs - logs.max())
    return weights / weights.sum()
