"""The files of a run directory: their names, what each holds, and which command writes which. `run_dir` owns the
directory's life (lock, resume, writes), `run_readme` the README that describes it."""

from __future__ import annotations

from flexsearch.engine.learner import LEARNER

CONFIG = "config.yaml"
SCORE = "score.json"
TRACE = "trace.jsonl"
SPLIT_JSONL = "split.jsonl"
SPLIT_CSV = "split.csv"
RESEARCH_JSONL = "split-research.jsonl"  # rows whose hardest prompt is not natural text (adversarial_suffix)
RESEARCH_CSV = "split-research.csv"
FORCED_JSONL = "split-forced.jsonl"  # rows whose hardest prompt carries a forced-choice template
FORCED_CSV = "split-forced.csv"
FAMILY_JSONL = "split-families.jsonl"  # one row per attack-eligible item and attack family searched
FAMILY_CSV = "split-families.csv"
# every split file pair a search writes (split_file_of in api.py says which row goes where)
SPLIT_FILES = ((SPLIT_JSONL, SPLIT_CSV), (FORCED_JSONL, FORCED_CSV), (RESEARCH_JSONL, RESEARCH_CSV))
PREDICTIONS = "predictions.jsonl"
LOCK = ".lock"
README = "README.md"

FILE_DESCRIPTIONS = {
    README: "this file",
    CONFIG: "every setting that decides the results (data and its SHA-256, model and file hash, search or "
            "scoring settings, versions); a rerun with the same settings resumes",
    SCORE: "the score: accuracy, ASR, control, fairness gap, verdict, overall and per category; every rate "
           "has its interval, denominator n and higher_is_better",
    SPLIT_JSONL: "the hardest prompt found per item, FLEX columns plus flexsearch's own (one JSON object a line)",
    SPLIT_CSV: "the same split as CSV (list columns as JSON text); loads in pandas and FLEX-style harnesses",
    RESEARCH_JSONL: "research runs only: the items whose hardest prompt carries an optimised token suffix "
                    "(natural: false), kept out of the split above",
    RESEARCH_CSV: "the same research rows as CSV",
    FORCED_JSONL: "only when a search allows forced-choice templates: the items whose hardest prompt carries "
                  "one (it excludes an option, asks for an assumption or demands a person), kept out of the "
                  "split above and scored apart (score.json: forced_choice)",
    FORCED_CSV: "the same forced-choice rows as CSV",
    FAMILY_JSONL: "the hardest label-valid prompt per attack-eligible item in each attack family searched (persona, "
                  "instruction, text: word edits alone, composition), FLEX's `attack` column naming the family; "
                  "score.json `families` has the ASR of each",
    FAMILY_CSV: "the same family split as CSV",
    TRACE: "append-only log of finished items (the resume point); a torn last line is dropped",
    LEARNER: "what each template, operator and composition gained on this model, per objective (the search's "
             "run-level learner; `--prior THIS_FOLDER` warm-starts another search with it)",
    PREDICTIONS: "per item: answer probabilities, prediction, correctness",
    LOCK: "present while a flexsearch process writes here (holds its pid)",
}
WRITES = {  # the files each command writes while it runs (the README lists those present)
    "search": (README, CONFIG, SCORE, SPLIT_JSONL, SPLIT_CSV, FAMILY_JSONL, FAMILY_CSV, RESEARCH_JSONL, RESEARCH_CSV,
               FORCED_JSONL, FORCED_CSV, TRACE, LEARNER, LOCK),
    "evaluate": (README, CONFIG, SCORE, PREDICTIONS, LOCK),
}
