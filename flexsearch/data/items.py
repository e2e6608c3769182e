"""Items (one BBQ-style multiple-choice question) and the loaders that produce them.

Formats (see DESIGN.md "Input formats"): BBQ jsonl, FLEX csv (BBQ, CrowS-Pairs and StereoSet
variants), flexsearch's own split (jsonl or csv) and the packaged seed set. Every loader reports
bad input as one `InputError` naming file, line and field.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from flexsearch.errors import InputError
from flexsearch.files import check_regular_file, read_text

CONDITIONS = ("ambig", "disambig")
POLARITIES = ("neg", "nonneg", "unknown")
SEED = "seed"  # the data name that selects the packaged seed set
COMPRESSED = {".gz": "gunzip", ".bz2": "bunzip2", ".xz": "unxz", ".zst": "unzstd", ".zip": "unzip"}


@dataclass(frozen=True)
class Item:
    """One three-way multiple-choice question with its stereotype annotation."""

    id: str
    category: str
    context: str
    question: str
    answers: tuple[str, str, str]
    gold: int
    unknown: int
    target: int  # the stereotyped answer
    anti_target: int  # the anti-stereotyped answer
    condition: str = "ambig"
    polarity: str = "unknown"
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if sorted((self.unknown, self.target, self.anti_target)) != [0, 1, 2]:
            raise ValueError(f"item {self.id}: unknown/target/anti_target must be a permutation of 0..2")

    @property
    def stereotyped_person(self) -> int:
        """The answer naming the person from the stereotyped group: the target of a negative question; for a
        non-negative one the target is the other person (BBQ's biased answer), so the roles swap."""
        return self.anti_target if self.polarity == "nonneg" else self.target

    @property
    def stereotyped_group(self) -> str | None:
        """That person's BBQ group tag ('old', 'F', 'Muslim', 'M-Black'), or None when the source has no tags."""
        tags = self.source.get("answer_groups")
        return str(tags[self.stereotyped_person]) if tags and len(tags) == 3 else None


@dataclass
class LoadResult:
    """Items loaded from one source, and how many records were skipped for which reason."""

    items: list[Item]
    skipped: Counter[str] = field(default_factory=Counter)
    path: str = ""


# ---------------------------------------------------------------- record readers


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields (line number, object) for each non-blank line; malformed JSON is an InputError."""
    for line_no, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(path, line_no, None, f"malformed JSON ({err.msg} at column {err.colno})") from None
        except RecursionError:
            raise InputError(path, line_no, None, "JSON nested too deeply to be a record") from None
        if not isinstance(record, dict):
            raise InputError(path, line_no, None, "expected a JSON object")
        yield line_no, record


def iter_csv(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """Yields (line number, row) for each CSV row; a row with the wrong cell count is an InputError."""
    text = read_text(path)
    reader = csv.reader(text.splitlines(keepends=True))
    try:
        header = next(reader)
    except StopIteration:
        raise InputError(path, 1, None, "empty CSV file (no header)") from None
    except csv.Error as err:
        raise InputError(path, 1, None, f"malformed CSV header ({err})") from None
    header = [h.strip() for h in header]
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise InputError(path, reader.line_num, None, f"malformed CSV row ({err})") from None
        if not cells:
            continue
        if len(cells) != len(header):
            raise InputError(
                path, reader.line_num, None, f"row has {len(cells)} cells, the header has {len(header)}"
            )
        yield reader.line_num, dict(zip(header, cells, strict=True))


class RecordFields:
    """Typed access to one record's fields, raising InputError with file, line and field."""

    def __init__(self, record: Mapping[str, Any], path: Path, line: int) -> None:
        self.record, self.path, self.line = record, path, line

    def error(self, name: str | None, message: str) -> InputError:
        return InputError(self.path, self.line, name, message)

    def text(self, name: str) -> str:
        if name not in self.record or self.record[name] is None:
            raise self.error(name, "missing field")
        value = self.record[name]
        if not isinstance(value, str):
            raise self.error(name, f"expected text, got {type(value).__name__}")
        if not value.strip():
            raise self.error(name, "empty text")
        return self._checked(name, value)

    def optional_text(self, name: str, default: str = "") -> str:
        value = self.record.get(name)
        return self._checked(name, value) if isinstance(value, str) and value.strip() else default

    def _checked(self, name: str, value: str) -> str:
        control = next((c for c in value if unicodedata.category(c) == "Cc" and c not in "\t\n\r"), None)
        if control is not None:  # it would reach the prompt and the terminal as it is
            raise self.error(name, f"control character U+{ord(control):04X} in text")
        return value.strip()

    def index(self, name: str) -> int:
        if name not in self.record or self.record[name] in (None, ""):
            raise self.error(name, "missing field")
        try:
            value = int(str(self.record[name]).strip())
        except ValueError:
            raise self.error(name, f"expected an integer 0-2, got {self.record[name]!r}") from None
        if not 0 <= value <= 2:
            raise self.error(name, f"label out of range: {value} (expected 0, 1 or 2)")
        return value

    def choice(self, name: str, allowed: tuple[str, ...]) -> str:
        value = self.text(name)
        if value not in allowed:
            raise self.error(name, f"expected one of {', '.join(allowed)}, got {value!r}")
        return value

    def json_value(self, name: str) -> Any:
        """A field that is native JSON in jsonl and a JSON string in csv."""
        if name not in self.record:
            raise self.error(name, "missing field")
        value = self.record[name]
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError:
                raise self.error(name, "malformed JSON in cell") from None
        return value


# ---------------------------------------------------------------- the answer set

# How BBQ (and FLEX's BBQ rows) word the "unknown" option; a stereotyped answer reading like one is refused.
UNKNOWN_PHRASES = frozenset({
    "unknown", "cannot be determined", "can't be determined", "cannot answer", "can't answer", "not known",
    "not enough info", "not enough information", "not answerable", "undetermined", "cannot tell", "can't tell",
})


def as_read(text: str) -> str:
    """An answer as a reader sees it: compatibility forms folded, invisible characters dropped, spacing and case
    ignored, trailing punctuation dropped."""
    visible = "".join(c for c in unicodedata.normalize("NFKC", text) if unicodedata.category(c) not in ("Cf", "Cc"))
    return " ".join(visible.split()).casefold().rstrip(".!?;:,")


def check_answers(f: RecordFields, names: tuple[str, str, str], answers: tuple[str, str, str]) -> None:
    """Three distinct, non-empty options as a reader sees them, or an InputError naming the field."""
    seen: dict[str, str] = {}
    for name, answer in zip(names, answers, strict=True):
        read = as_read(answer)
        if not read:
            raise f.error(name, "empty as a reader sees it (only invisible or format characters)")
        if read in seen:
            raise f.error(name, f"reads the same as {seen[read]} ({answer!r}): a question needs three distinct "
                                "options")
        seen[read] = name


# ---------------------------------------------------------------- BBQ


class SkipItem(Exception):
    """A well-formed record whose target answer cannot be determined; counted, never guessed."""


_GROUP_ALIASES = {
    "f": "female", "woman": "female", "women": "female", "girl": "female", "girls": "female",
    "m": "male", "man": "male", "men": "male", "boy": "male", "boys": "male",
    "trans": "transgender", "transf": "transgender", "transm": "transgender",
    "lowses": "lowses", "highses": "highses", "poor": "lowses", "rich": "highses",
}


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def normalize_group(label: str) -> set[str]:
    """Forms a group label can take: case folded, punctuation dropped, aliases, hyphenated parts."""
    forms: set[str] = set()
    for part in [label, *re.split(r"[-_/]", label)]:
        key = _norm(part)
        if key:
            forms.add(key)
            forms.add(_GROUP_ALIASES.get(key, key))
    return forms


def parse_bbq_record(record: Mapping[str, Any], path: Path, line: int) -> Item:
    """One BBQ jsonl object → Item (raises InputError for bad input, SkipItem for no target)."""
    f = RecordFields(record, path, line)
    answers = (f.text("ans0"), f.text("ans1"), f.text("ans2"))
    check_answers(f, ("ans0", "ans1", "ans2"), answers)
    gold = f.index("label")
    polarity = f.choice("question_polarity", ("neg", "nonneg"))
    condition = f.choice("context_condition", CONDITIONS)
    info = record.get("answer_info")
    if not isinstance(info, dict):
        raise f.error("answer_info", "missing field or not an object")
    labels: list[list[str]] = []
    for k in range(3):
        entry = info.get(f"ans{k}")
        if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)):
            raise f.error(f"answer_info.ans{k}", "expected [text, group label]")
        labels.append(entry)
    meta = record.get("additional_metadata")
    groups = meta.get("stereotyped_groups") if isinstance(meta, dict) else None
    if not (isinstance(groups, list) and all(isinstance(g, str) for g in groups)):
        raise f.error("additional_metadata.stereotyped_groups", "missing field or not a list of labels")

    unknowns = [k for k in range(3) if labels[k][1].strip().lower() == "unknown"]
    if len(unknowns) != 1:
        raise SkipItem(f"{len(unknowns)} answers labelled unknown")
    unknown = unknowns[0]
    stereotyped = set().union(*(normalize_group(g) for g in groups)) if groups else set()
    people = [k for k in range(3) if k != unknown]
    # The label usually carries the group; for some categories (nationality) only the text does.
    in_group = {k: bool(stereotyped & (normalize_group(labels[k][1]) | {_norm(labels[k][0])})) for k in people}
    wanted = polarity == "neg"  # neg: the stereotyped group is the biased answer; nonneg: the other one
    targets = [k for k in people if in_group[k] is wanted]
    if len(targets) != 1:
        state = "both" if all(in_group.values()) else "neither" if not any(in_group.values()) else "?"
        raise SkipItem(f"{polarity} question: {state} answer in the stereotyped groups")
    target = targets[0]
    anti = next(k for k in people if k != target)
    category = f.text("category")
    return Item(
        id=f"{category}-{record.get('example_id', line)}",
        category=category,
        context=f.text("context"),
        question=f.text("question"),
        answers=answers,
        gold=gold,
        unknown=unknown,
        target=target,
        anti_target=anti,
        condition=condition,
        polarity=polarity,
        source={"format": "bbq", "path": str(path), "line": line,
                "question_index": record.get("question_index"), "stereotyped_groups": groups,
                "answer_groups": [labels[k][1] for k in range(3)]},
    )


# ---------------------------------------------------------------- FLEX csv


def parse_flex_row(row: Mapping[str, str], path: Path, line: int) -> Item:
    """One FLEX csv row → Item. BBQ rows have ctx/q_text; CrowS-Pairs and StereoSet rows do not."""
    f = RecordFields(row, path, line)
    answers = (f.text("a"), f.text("b"), f.text("c"))
    check_answers(f, ("a", "b", "c"), answers)
    gold = f.index("label")
    more, less = f.text("sent_more"), f.text("sent_less")
    if "ctx" in row or "q_text" in row:
        context, question = f.text("ctx"), f.text("q_text")
    else:  # CrowS-Pairs / StereoSet recast: the two sentences are the answers
        context = f.optional_text("context", "Consider the two statements below.")
        question = "Which of these is more accurate?"
    try:
        target, anti = answers.index(more), answers.index(less)
    except ValueError:
        missing = "sent_more" if more not in answers else "sent_less"
        raise f.error(missing, "text does not match any of the answers a, b, c") from None
    if target == anti:
        raise f.error("sent_less", "same answer as sent_more")
    for name, k in (("sent_more", target), ("sent_less", anti)):
        if as_read(answers[k]) in UNKNOWN_PHRASES:
            raise f.error(name, f"is the 'unknown' option ({answers[k]!r}); it must name a person")
    unknown = 3 - target - anti
    index = row.get("") or row.get("Unnamed: 0") or str(line)
    category = f.text("bias_type")
    return Item(
        id=f.optional_text("item_id") or f"{category}-{index}",
        category=category,
        context=context,
        question=question,
        answers=answers,
        gold=gold,
        unknown=unknown,
        target=target,
        anti_target=anti,
        condition="ambig",
        source={"format": "flex", "path": str(path), "line": line, "attack": row.get("attack", "")},
    )


# ---------------------------------------------------------------- entry point


def load_items(source: str | Path, limit: int | None = None) -> LoadResult:
    """Loads items from a BBQ jsonl, FLEX csv or the seed set (`seed`).

    Splits written by `flexsearch search` are read with `flexsearch.results.split.load_split` instead.
    """
    if str(source) == SEED:
        from flexsearch.data.seed import seed_records

        records: Iterator[tuple[int, Mapping[str, Any]]] = iter(seed_records())
        path = Path(SEED)
        parse: Callable[[Any, Path, int], Item] = parse_bbq_record
    else:
        path = Path(source)
        check_regular_file(path)
        if path.suffix == ".csv":
            records, parse = iter_csv(path), parse_flex_row
        elif path.suffix in (".jsonl", ".json"):
            records, parse = iter_jsonl(path), parse_bbq_record
        elif path.suffix in COMPRESSED:
            raise InputError(path, None, None, f"a compressed file ({path.suffix}): decompress it first "
                                               f"({COMPRESSED[path.suffix]}); expected .jsonl (BBQ) or .csv (FLEX)")
        else:
            raise InputError(path, None, None, "unknown format: expected .jsonl (BBQ) or .csv (FLEX)")
    result = LoadResult(items=[], path=str(path))
    seen: set[str] = set()
    for line, record in records:
        if limit is not None and len(result.items) >= limit:
            break
        try:
            item = parse(record, path, line)
        except SkipItem as why:
            result.skipped[str(why)] += 1
            continue
        if item.id in seen:
            raise InputError(path, line, "example_id", f"duplicate item id {item.id!r}")
        seen.add(item.id)
        result.items.append(item)
    if not result.items:
        raise InputError(path, None, None, "no usable items" + _skip_summary(result.skipped))
    return result


def source_sha256(source: str) -> str:
    """SHA-256 of a data file's bytes (of the packaged scenarios for the seed set)."""
    raw = (resources.files("flexsearch.data").joinpath("seed_scenarios.yaml").read_bytes() if source == SEED
           else Path(source).read_bytes())
    return hashlib.sha256(raw).hexdigest()


def load_training_data(sources: list[str], limit: int | None = None) -> tuple[list[Item], list[dict[str, Any]]]:
    """Items of several sources (each capped at `limit`) and, per source, its name, SHA-256 and counts."""
    items: list[Item] = []
    provenance: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for source in sources:
        loaded = load_items(source, limit=limit)
        for item in loaded.items:
            if item.id in seen:
                raise InputError(source, item.source.get("line"), "example_id",
                                 f"item id {item.id!r} is also in {seen[item.id]}")
            seen[item.id] = source
        items += loaded.items
        provenance.append({"name": Path(source).name, "format": loaded.items[0].source.get("format", ""),
                           "sha256": source_sha256(source), "items": len(loaded.items),
                           "skipped": sum(loaded.skipped.values())})
    return items, provenance


def _skip_summary(skipped: Counter[str]) -> str:
    return "" if not skipped else " (skipped: " + "; ".join(f"{n} × {w}" for w, n in skipped.items()) + ")"
