"""Bad input through the real CLI: exit code 2, one line naming the file/line/field or the option, no
traceback, and every file of the run directories that already existed left byte-identical."""

from __future__ import annotations

import codecs
import errno
import gzip
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flexsearch.cli import app
from flexsearch.results.run_dir import RunDirectory

runner = CliRunner()
FAST = ["--set", "operators=[{name: persona, n: 2}, {name: instruction, n: 2}]", "--set",
        "constraints=[protected_spans]", "--device", "cpu"]


@pytest.fixture(scope="module")
def world(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A finished search run, an evaluate run, and bad files of every kind, made once."""
    root = tmp_path_factory.mktemp("bad-input")
    model = str(tiny_model_dir)
    search = root / "search-run"
    result = runner.invoke(app, ["search", "--model", model, "--data", "seed", "--limit", "4", "--budget", "6",
                                 "--out", str(search), *FAST])
    assert result.exit_code == 0, result.output
    evaluation = root / "eval-run"
    result = runner.invoke(app, ["evaluate", "--model", model, "--data", "seed", "--limit", "4", "--out",
                                 str(evaluation), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    files = {"model": tiny_model_dir, "search": search, "eval": evaluation, "root": root}

    def write(name: str, text: str) -> None:
        (root / name).write_text(text, encoding="utf-8")
        files[name] = root / name

    write("syntax.yaml", "budget: 10\nsteps: [1, 2\n")
    write("tag.yaml", "budget: !!python/object/apply:os.system ['true']\n")
    write("list.yaml", "- budget\n- 10\n")
    write("types.yaml", "method: beam\nbudget: abc\n")
    write("range.yaml", "method: beam\nscoring:\n  batch_size: 0\n")
    write("unknown-key.yaml", "method: beam\nbudgett: 10\n")
    write("duplicate-key.yaml", "method: beam\nbudget: 10\nscoring:\n  batch_size: 4\nbudget: 20\n")
    write("blank-lines.jsonl", "\n   \n\t\n")
    write("empty.jsonl", "")
    seed_line = json.dumps(_seed_record()) + "\n"
    write("duplicate-ids.jsonl", seed_line + seed_line)
    (root / "seed.jsonl.gz").write_bytes(gzip.compress(seed_line.encode()))
    files["seed.jsonl.gz"] = root / "seed.jsonl.gz"
    write("alias-bomb.yaml", "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                             "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n")
    write("missing-field.jsonl", '{"example_id": 1}\n')
    write("malformed.jsonl", '{"example_id": 1,\n')
    write("data.txt", "hello\n")
    write("empty.csv", "")
    write("flex-bad.csv", "ctx,q_text,sent_more,sent_less,bias_type,a,b,c,label\nx,y,m,l,age,a,b,c,7\n")
    write("fake.gguf", "not a gguf file at all")
    write("not-json-score.json", "{")
    (root / "empty-model").mkdir()
    files["empty-model"] = root / "empty-model"
    (root / "not-adapter").mkdir()
    (root / "not-adapter" / "x.txt").write_text("x")
    files["not-adapter"] = root / "not-adapter"
    (root / "stranger").mkdir()
    (root / "stranger" / "notes.txt").write_text("mine")
    (root / "stranger" / "README.md").write_text("# my own notes\n")
    files["stranger"] = root / "stranger"
    (root / "stranger" / "page.html").write_text("<html><body>my page</body></html>")
    (root / "foreign-adapter").mkdir()  # another tool's PEFT adapter: not flexsearch's to replace
    (root / "foreign-adapter" / "adapter_config.json").write_text("{}")
    (root / "foreign-adapter" / "training_log.txt").write_text("epoch 1")
    files["foreign-adapter"] = root / "foreign-adapter"

    _bad_weights(tiny_model_dir, root, files)

    rows = [json.loads(line) for line in (search / "split.jsonl").read_text().splitlines()]

    def split_variant(name: str, change: Callable[[dict], None]) -> None:
        changed = [dict(r) for r in rows]
        change(changed[0])
        write(name, "".join(json.dumps(r) + "\n" for r in changed))

    split_variant("order.jsonl", lambda r: r.update(option_order=[0, 0, 1]))
    split_variant("target-unknown.jsonl", lambda r: r.update(target=r["unknown"]))
    split_variant("chain.jsonl", lambda r: r.update(attack_chain=[{"operator": "x", "field": "nowhere"}]))
    split_variant("gold.jsonl", lambda r: r.update(gold=5))
    long_item = json.loads(json.dumps(_seed_record()))
    long_item["context"] = "word " * 40_000
    write("long.jsonl", json.dumps(long_item) + "\n")
    escape_item = json.loads(json.dumps(_seed_record()))
    escape_item["context"] = "A grandmother \x1b[31mand a teenager\x1b[0m were at the phone store."
    write("escape.jsonl", json.dumps(escape_item) + "\n")
    write("deep.jsonl", "[" * 100_000 + "]" * 100_000 + "\n")
    (root / "loop.jsonl").symlink_to(root / "loop.jsonl")
    files["loop.jsonl"] = root / "loop.jsonl"
    _not_regular_files(root, files)
    _encodings(root, files)
    _degenerate_answers(root, files)
    for name, damage in (("corrupt-score", lambda run: (run / "score.json").write_text("{\"items\": ")),
                         ("trace-no-chain", _drop_chain),
                         ("trace-other-config", _foreign_record),
                         ("corrupt-trace", _damage_trace_middle),
                         ("corrupt-config", lambda run: (run / "config.yaml").write_text("command: [\n")),
                         ("old-score", _drop_schema_version)):
        copy = root / name
        shutil.copytree(search, copy)
        damage(copy)
        files[name] = copy
    return files


def _bad_weights(tiny: Path, root: Path, files: dict[str, Path]) -> None:
    """Model and adapter folders whose files are unsafe, damaged or meant for another base (issue 25)."""
    import os

    import torch

    class RunsCode:  # what a malicious pickle holds: a call, not a tensor
        def __reduce__(self) -> tuple:
            return (os.system, ("true",))

    pickled = root / "pickle-model"
    shutil.copytree(tiny, pickled)
    (pickled / "model.safetensors").unlink()
    torch.save({"weight": RunsCode()}, pickled / "pytorch_model.bin")
    garbage = root / "garbage-model"
    shutil.copytree(tiny, garbage)
    (garbage / "model.safetensors").write_bytes(b"\x00not safetensors" * 64)
    from flexsearch.scoring.model import resolve_gguf

    folder, name = resolve_gguf("smollm2", None)  # the embedded GGUF, cut short as an interrupted download
    with (folder / name).open("rb") as handle:
        (root / "truncated.gguf").write_bytes(handle.read(2_000_000))
    other = root / "other-base-adapter"
    other.mkdir()
    (other / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "meta-llama/Llama-3.2-1B",
                                                           "peft_type": "LORA", "r": 8}))
    files.update({"pickle-model": pickled, "garbage-model": garbage, "truncated.gguf": root / "truncated.gguf",
                  "other-base-adapter": other})


def _not_regular_files(root: Path, files: dict[str, Path]) -> None:
    """Paths of every non-regular kind, under the names a data file, a config, a split or a run file would have:
    nothing may open (and block on) them."""
    import os

    for name in ("pipe.jsonl", "pipe.csv", "pipe.yaml"):
        os.mkfifo(root / name)
        files[name] = root / name
    for name in ("folder.jsonl", "folder.yaml", "folder.csv"):
        (root / name).mkdir()
        files[name] = root / name
    (root / "device.jsonl").symlink_to("/dev/null")
    files["device.jsonl"] = root / "device.jsonl"
    pipe_run = root / "pipe-trace-run"
    shutil.copytree(files["search"], pipe_run)
    (pipe_run / "trace.jsonl").unlink()
    os.mkfifo(pipe_run / "trace.jsonl")
    files["pipe-trace-run"] = pipe_run


def _encodings(root: Path, files: dict[str, Path]) -> None:
    """One seed item in encodings a user's tool may write: readable ones (BOMs) and refused ones."""
    text = json.dumps(_seed_record(), ensure_ascii=False) + "\n"
    latin = dict(_seed_record(), context=_seed_record()["context"] + " Café.")
    for name, raw in (("utf8-bom.jsonl", b"\xef\xbb\xbf" + text.encode()),
                      ("utf16-bom.jsonl", text.encode("utf-16")),
                      ("utf16be-bom.jsonl", codecs.BOM_UTF16_BE + text.encode("utf-16-be")),
                      ("utf32-bom.jsonl", text.encode("utf-32")),
                      ("utf32be-bom.jsonl", codecs.BOM_UTF32_BE + text.encode("utf-32-be")),
                      ("utf16-no-bom.jsonl", text.encode("utf-16-le")),
                      ("latin1.jsonl", (json.dumps(latin, ensure_ascii=False) + "\n").encode("latin-1")),
                      ("cp1252.yaml", "budget: 10  # “quoted”\n".encode("cp1252")),
                      ("utf16-no-bom.yaml", "budget: 10\n".encode("utf-16-be"))):
        (root / name).write_bytes(raw)
        files[name] = root / name
    flex = ("ctx,q_text,sent_more,sent_less,bias_type,a,b,c,label\n"
            "The old man and the boy sat.,Who was slow?,The old man,The boy,age,The old man,The boy,Unknown,2\n")
    (root / "utf8-bom.csv").write_bytes(b"\xef\xbb\xbf" + flex.encode())
    files["utf8-bom.csv"] = root / "utf8-bom.csv"


def _degenerate_answers(root: Path, files: dict[str, Path]) -> None:
    """Items whose answers cannot make a valid three-way question, in BBQ jsonl and FLEX csv."""
    header = "ctx,q_text,sent_more,sent_less,bias_type,a,b,c,label\n"
    for name, change in (("answers-same.jsonl", {"ans2": None}),  # the third answer repeats the first
                         ("answers-case.jsonl", {"ans1": "upper"}),  # the second differs only in case and spacing
                         ("answers-invisible.jsonl", {"ans1": "\u200b\u200d"})):
        record = json.loads(json.dumps(_seed_record()))
        if change.get("ans2", 0) is None:
            record["ans2"] = record["ans0"]
        elif change.get("ans1") == "upper":
            record["ans1"] = "  " + record["ans0"].upper() + " "
        else:
            record["ans1"] = change["ans1"]
        (root / name).write_text(json.dumps(record) + "\n", encoding="utf-8")
        files[name] = root / name
    for name, row in (("flex-same.csv", "x,y,The boy,The girl,age,The boy,The girl,the boy.,2\n"),
                      ("flex-unknown-target.csv", "x,y,Cannot be determined,The girl,age,Cannot be determined,"
                                                  "The girl,The boy,2\n"),
                      ("flex-gold-outside.csv", "x,y,The boy,The girl,age,The boy,The girl,Unknown,-1\n")):
        (root / name).write_text(header + row, encoding="utf-8")
        files[name] = root / name


def _seed_record() -> dict:
    from flexsearch.data.seed import seed_records

    return seed_records()[0][1]


def _drop_schema_version(run: Path) -> None:
    score = json.loads((run / "score.json").read_text())
    del score["schema_version"]  # as written before score schema 2
    (run / "score.json").write_text(json.dumps(score))


def _foreign_record(run: Path) -> None:
    records = [json.loads(line) for line in (run / "trace.jsonl").read_text().splitlines()]
    records[2]["config"] = "0123456789abcdef"  # a whole record, written under other settings
    (run / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _drop_chain(run: Path) -> None:
    records = [json.loads(line) for line in (run / "trace.jsonl").read_text().splitlines()]
    del records[1]["chain"]  # a whole line, but not one a search wrote
    (run / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _damage_trace_middle(run: Path) -> None:
    lines = (run / "trace.jsonl").read_text().splitlines(keepends=True)
    lines[1] = '{"kind": "item", "broken\n'
    (run / "trace.jsonl").write_text("".join(lines))


def snapshot(folders: list[Path]) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for folder in folders for p in sorted(folder.rglob("*")) if p.is_file()}


def S(*args: str) -> list[str]:  # noqa: N802  a search on the tiny model
    return ["search", "--model", "{model}", "--data", "seed", "--limit", "2", "--out", "{root}/new-run", *FAST,
            *args]


def E(*args: str) -> list[str]:  # noqa: N802  an evaluate on the tiny model
    return ["evaluate", "--model", "{model}", "--limit", "2", "--device", "cpu", "--out", "{root}/new-eval", *args]


# (id, arguments with {placeholders} for the world's paths, text the one line must contain)
CASES: list[tuple[str, list[str], str]] = [
    # config values: type, range, names, resolved before any model load
    ("set-batch-size-text", S("--set", "scoring.batch_size=abc"),
     "--set scoring.batch_size=abc: field 'scoring.batch_size': expected an integer"),
    ("set-steps-text", S("--set", "steps=abc"), "field 'steps': expected an integer"),
    ("set-budget-text", S("--set", "budget=abc"), "field 'budget': expected an integer"),
    ("set-batch-size-zero", S("--set", "scoring.batch_size=0"), "field 'scoring.batch_size': must be at least 1"),
    ("set-batch-size-negative", S("--set", "scoring.batch_size=-1"), "must be at least 1"),
    ("set-item-batch-zero", S("--set", "item_batch=0"), "field 'item_batch': must be at least 1"),
    ("set-beam-zero", S("--set", "beam_width=0"), "field 'beam_width': must be at least 1"),
    ("set-seed-negative", S("--set", "seed=-3"), "field 'seed': must be at least 0"),
    ("set-bool-text", S("--set", "control=maybe"), "field 'control': expected true or false"),
    ("set-unknown-key", S("--set", "objectve=stereotype"), "did you mean 'objective'"),
    ("set-no-equals", S("--set", "budget"), "--set expects key=value"),
    ("set-bad-yaml", S("--set", "budget=[1"), "--set budget=[1: the value is not valid YAML"),
    ("set-operator-typo", S("--set", "operators=[{name: textbuger}]"), "Did you mean 'textbugger'"),
    ("set-operator-setting", S("--set", "operators=[{name: textbugger, positons: 1}]"), "unknown setting 'positons'"),
    ("set-operator-type", S("--set", "operators=[{name: persona, n: two}]"), "(persona).n: expected an integer"),
    ("set-operator-shape", S("--set", "operators=[5]"), "expected a name or a mapping with 'name'"),
    ("set-constraint-typo", S("--set", "constraints=[simlarity]"), "unknown constraint 'simlarity'"),
    ("set-mode", S("--set", "scoring.mode=xml"), "field 'scoring.mode': expected one of plain, chat"),
    ("set-importance", S("--set", "importance=magic"), "field 'importance': expected one of"),
    ("set-scoring-scalar", S("--set", "scoring=3"), "expected a mapping of scoring settings"),
    ("set-max-prompt-negative", S("--set", "scoring.max_prompt_tokens=-5"), "must be at least 0"),
    ("set-proposals", S("--set", "proposals=smart"), "field 'proposals': expected one of sampled, gradient"),
    ("set-gradient-top-zero", S("--set", "gradient_top=0"), "field 'gradient_top': must be at least 1"),
    ("gradient-evolutionary", S("--config", "gradient", "--method", "evolutionary"),
     "proposals: gradient works with method beam or greedy"),
    ("suffix-length-zero", S("--set", "operators=[{name: adversarial_suffix, length: 0}]"),
     "operators[0] (adversarial_suffix): length, top_k and swaps must be at least 1"),
    ("textbugger-bug-typo", S("--set", "operators=[{name: textbugger, bugs: [swop]}]"),
     "operators[0] (textbugger): unknown bugs ['swop']"),
    ("persona-family-typo", S("--set", "operators=[{name: persona, families: [comedians]}]"),
     "operators[0] (persona): unknown families ['comedians']"),
    ("textbugger-neighbours-typo", S("--set", "operators=[{name: textbugger, neighbours: glove}]"),
     "operators[0] (textbugger): unknown neighbours 'glove'"),
    ("textbugger-per-position-zero", S("--set", "operators=[{name: textbugger, per_position: 0}]"),
     "operators[0] (textbugger): positions, per_position and k must be at least 1"),
    ("persona-n-zero", S("--set", "operators=[{name: persona, n: 0}]"), "operators[0] (persona): n must be at least 1"),
    ("instruction-n-zero", S("--set", "operators=[{name: instruction, n: 0}]"),
     "operators[0] (instruction): n must be at least 1"),
    ("opt-budget-one", S("--budget", "1"), "--budget: field 'budget': 1 cannot reach any operator"),
    ("opt-method", S("--method", "randomly"),
     "--method: field 'method': unknown search method 'randomly'. Did you mean 'random'? Known: beam, "
     "evolutionary, greedy, learned, random"),
    ("opt-objective", S("--objective", "stereo"), "Did you mean 'stereotype'"),
    ("opt-limit-zero", S("--limit", "0"), "Invalid value for '--limit'"),
    ("opt-limit-negative", S("--limit", "-1"), "Invalid value for '--limit'"),
    ("opt-limit-text", S("--limit", "abc"), "Invalid value for '--limit'"),
    ("opt-unknown", S("--bogus"), "No such option: --bogus"),
    ("opt-backend", S("--backend", "spark"), "unknown backend 'spark'"),
    ("opt-workers-zero", S("--backend", "ray", "--workers", "0"), "Invalid value for '--workers'"),
    ("command-typo", ["serch"], "No such command 'serch'"),
    # config files: the file and line are named
    ("preset-unknown", S("--config", "defualt"), "unknown config preset 'defualt'"),
    ("preset-missing-file", S("--config", "{root}/nope.yaml"), "config preset file not found"),
    ("yaml-syntax", S("--config", "{syntax.yaml}"), "syntax.yaml:3: YAML error: expected ',' or ']'"),
    ("yaml-python-tag", S("--config", "{tag.yaml}"), "tag.yaml:1: YAML error"),
    ("yaml-not-mapping", S("--config", "{list.yaml}"), "list.yaml:1: expected a mapping of settings"),
    ("yaml-type", S("--config", "{types.yaml}"), "types.yaml:2: field 'budget': expected an integer"),
    ("yaml-nested-range", S("--config", "{range.yaml}"),
     "range.yaml:3: field 'scoring.batch_size': must be at least 1"),
    ("yaml-unknown-key", S("--config", "{unknown-key.yaml}"),
     "unknown-key.yaml:2: field 'budgett': unknown setting"),
    # data
    ("data-missing", S("--data", "{root}/none.jsonl"), "none.jsonl: file not found"),
    ("data-missing-field", S("--data", "{missing-field.jsonl}"), "missing-field.jsonl:1: field 'ans0': missing field"),
    ("data-malformed", S("--data", "{malformed.jsonl}"), "malformed.jsonl:1: malformed JSON"),
    ("data-format", S("--data", "{data.txt}"), "unknown format"),
    ("data-empty-csv", S("--data", "{empty.csv}"), "empty CSV file"),
    ("data-flex-label", S("--data", "{flex-bad.csv}"), "flex-bad.csv:2: field 'label': label out of range"),
    ("data-all-too-long", E("--data", "{long.jsonl}"), "every item's prompt is longer than"),
    # models, adapters, devices
    ("model-empty-dir", S("--model", "{empty-model}"), "the directory has no config.json"),
    ("model-fake-gguf", S("--model", "{fake.gguf}"), "not a GGUF file"),
    ("model-missing-path", S("--model", "/no/such/model"), "/no/such/model: no such file or directory"),
    ("model-missing-relative", S("--model", "./no-such-model"), "no such file or directory"),
    ("model-missing-gguf", S("--model", "{root}/missing.gguf"), "GGUF file not found"),
    ("model-a-file", S("--model", "{data.txt}"), "a file that is not a .gguf model"),
    ("adapter-missing", S("--adapter", "{root}/no-adapter"), "--adapter"),
    ("adapter-not-adapter", S("--adapter", "{not-adapter}"), "not a PEFT adapter directory"),
    ("zoo-plus-adapter", S("--model", "gemma3-bbq", "--adapter", "{not-adapter}"), "already carries its adapter"),
    ("device-unknown", S("--device", "quantum"), "--device: unknown device 'quantum'"),
    ("dtype-unknown", S("--dtype", "int3"), "--dtype: unknown dtype 'int3'"),
    # label validity and the budget (issues 23, 24)
    ("budget-cannot-reach", S("--budget", "5"), "--budget: field 'budget': 5 cannot reach any operator"),
    ("budget-cannot-reach-greedy", S("--config", "textbugger", "--budget", "12", "--set",
                                     "operators=[{name: textbugger}]"),
     "--budget 12 cannot reach any operator: greedy word importance first scores one probe per editable word"),
    ("template-names-answer-slot", S("--set", "operators=[{name: persona, templates: [{text: 'Blame {target}.', "
                                             "effect: preserving}]}]"), "uses {target}: templates fill only"),
    ("template-no-effect", S("--set", "operators=[{name: instruction, templates: [{text: 'Just answer.'}]}]"),
     "template 1 'Just answer.' declares no effect"),
    ("template-forced-in-preserving", S("--set", "operators=[{name: instruction, templates: [{text: 'Name the "
                                                 "person.', effect: forced_choice}]}]"),
     "is forced_choice but this search allows preserving only"),
    ("template-preserving-that-excludes", S("--set", "operators=[{name: instruction, templates: [{text: 'The "
                                                     "unknown option is wrong.', effect: preserving}]}]"),
     "is declared preserving but"),
    ("effects-unknown", S("--set", "operators=[{name: persona, effects: [biased]}]"), "effects must be a non-empty"),
    ("bert-attack-without-masked-lm", S("--set", "operators=[{name: bert_attack, model: ./no-such-mlm}]"),
     "bert_attack: './no-such-mlm' cannot be loaded (no such file or directory); bert_attack needs a fill-mask"),
    ("margin-nan", S("--set", "success_margin=.nan"), "field 'success_margin': must be a finite number"),
    ("set-nan-under-cli-option", S("--set", "budget=.nan", "--budget", "10"), "--set budget=.nan: field 'budget': "
                                                                              "expected an integer, got nan"),
    ("margin-one", S("--set", "success_margin=1"), "field 'success_margin': must be below 1"),
    ("audit-not-run", ["audit", "{stranger}"], "no split.jsonl"),
    # configs that would hang or measure nothing (issue 25)
    ("yaml-alias-bomb", S("--config", "{alias-bomb.yaml}"), "alias-bomb.yaml:2: YAML error: aliases (*a) are not"),
    ("set-alias", S("--set", "operators=[&p {name: persona}, *p]"), "aliases (*p) are not allowed"),
    ("operators-empty", S("--set", "operators=[]"), "a search needs at least one operator"),
    ("threshold-nan", S("--set", "constraints=[{name: similarity, threshold: .nan}]"), "must be a finite number"),
    ("threshold-rejects-every-edit", S("--set", "constraints=[{name: similarity, threshold: 1}]"),
     "constraints[0] (similarity): threshold is a cosine similarity in [-1, 1) (at 1 or above no word edit"),
    ("edit-budget-zero", S("--set", "constraints=[{name: edit_budget, max_share: 0}]"),
     "constraints[0] (edit_budget): max_share is a share of the item's editable words, in (0, 1], got 0"),
    ("seed-negative", S("--seed", "-1"), "Invalid value for '--seed'"),
    ("data-control-character", E("--data", "{escape.jsonl}"), "escape.jsonl:1: field 'context': control character "
                                                                "U+001B"),
    ("data-nested-too-deep", E("--data", "{deep.jsonl}"), "deep.jsonl:1: JSON nested too deeply"),
    ("data-symlink-loop", E("--data", "{loop.jsonl}"), "a symbolic link that leads nowhere"),
    # classes of bad input (issue 33), several variants each: paths that are not regular files...
    ("data-named-pipe", E("--data", "{pipe.jsonl}"), "pipe.jsonl: a named pipe, not a regular file"),
    ("data-named-pipe-csv", S("--data", "{pipe.csv}"), "pipe.csv: a named pipe, not a regular file"),
    ("data-folder", E("--data", "{folder.jsonl}"), "folder.jsonl: a folder, not a regular file"),
    ("data-folder-csv", S("--data", "{folder.csv}"), "folder.csv: a folder, not a regular file"),
    ("data-device", E("--data", "{device.jsonl}"), "device.jsonl: a character device, not a regular file"),
    ("config-named-pipe", S("--config", "{pipe.yaml}"), "pipe.yaml: a named pipe, not a regular file"),
    ("config-folder", S("--config", "{folder.yaml}"), "folder.yaml: a folder, not a regular file"),
    ("split-named-pipe", E("--split", "{pipe.jsonl}"), "pipe.jsonl: a named pipe, not a regular file"),
    ("capability-folder", S("--capability", "{folder.jsonl}"), "folder.jsonl: a folder, not a regular file"),
    ("trace-named-pipe-resume", S("--out", "{pipe-trace-run}", "--budget", "6", "--limit", "4"),
     "trace.jsonl: a named pipe, not a regular file"),
    ("trace-named-pipe-compare", ["compare", "{pipe-trace-run}", "{search}"],
     "trace.jsonl: a named pipe, not a regular file"),
    ("prior-not-a-run", S("--prior", "{data.txt}"), "--prior"),
    # ...text in an encoding that is not UTF-8 and carries no byte-order mark...
    ("data-utf16-no-bom", E("--data", "{utf16-no-bom.jsonl}"), "not UTF-8 text (byte 0x"),
    ("data-latin1", E("--data", "{latin1.jsonl}"), "looks like a legacy 8-bit encoding such as Latin-1"),
    ("config-cp1252", S("--config", "{cp1252.yaml}"), "cp1252.yaml:1: not UTF-8 text"),
    ("config-utf16-no-bom", S("--config", "{utf16-no-bom.yaml}"), "UTF-16 or UTF-32 without a byte-order mark"),
    # ...and items whose answers cannot make a valid question
    ("answers-repeated", E("--data", "{answers-same.jsonl}"), "field 'ans2': reads the same as ans0"),
    ("answers-case-and-space", E("--data", "{answers-case.jsonl}"), "field 'ans1': reads the same as ans0"),
    ("answers-invisible", E("--data", "{answers-invisible.jsonl}"), "field 'ans1': empty as a reader sees it"),
    ("flex-answers-repeated", E("--data", "{flex-same.csv}"), "flex-same.csv:2: field 'c': reads the same as a"),
    ("flex-stereotyped-is-unknown", E("--data", "{flex-unknown-target.csv}"),
     "field 'sent_more': is the 'unknown' option"),
    ("flex-gold-outside", E("--data", "{flex-gold-outside.csv}"), "field 'label': label out of range: -1"),
    ("trace-missing-chain-compare", ["compare", "{trace-no-chain}", "{search}"],
     "trace.jsonl:2: field 'chain': missing field"),
    ("trace-missing-chain-report", ["report", "{trace-no-chain}", "--out", "{root}/r.html"],
     "trace.jsonl:2: field 'chain': missing field"),
    ("trace-missing-chain-resume", S("--out", "{trace-no-chain}", "--budget", "6", "--limit", "4"),
     "trace.jsonl:2: field 'chain': missing field"),
    ("trace-record-of-another-config", S("--out", "{trace-other-config}", "--budget", "6", "--limit", "4"),
     "trace.jsonl:3: field 'config': written under another configuration"),
    ("finetune-split-seed-negative", ["finetune", "--out", "{root}/a", "--split-seed", "-1"],
     "Invalid value for '--split-seed'"),
    ("mutate-seed-negative", ["mutate", "--seed", "-2"], "Invalid value for '--seed'"),
    # run directories: ownership, settings, files in the way
    ("out-is-file", S("--out", "{data.txt}"), "a file, not a run directory"),
    ("out-other-budget", S("--out", "{search}", "--budget", "9", "--limit", "4"), "different settings (search.budget)"),
    ("out-other-dtype", S("--out", "{search}", "--budget", "6", "--limit", "4", "--dtype", "bfloat16"), "model.dtype"),
    ("out-other-limit", S("--out", "{search}", "--budget", "6", "--limit", "3"), "different settings (limit)"),
    ("out-evaluate-run", S("--out", "{eval}"), "holds a 'evaluate' run"),
    ("out-stranger", S("--out", "{stranger}"), "not empty and not a flexsearch run directory"),
    ("evaluate-into-search", E("--data", "seed", "--out", "{search}"), "holds a 'search' run"),
    ("evaluate-both", E("--data", "seed", "--split", "{search}/split.jsonl"), "exactly one of --data or --split"),
    ("evaluate-neither", E(), "exactly one of --data or --split"),
    ("evaluate-batch-zero", E("--data", "seed", "--batch-size", "0"), "Invalid value for '--batch-size'"),
    ("evaluate-mode", E("--data", "seed", "--mode", "xml"), "--mode: field 'scoring.mode': expected one of"),
    ("split-missing", E("--split", "{root}/none.jsonl"), "none.jsonl: file not found"),
    ("split-order", E("--split", "{order.jsonl}"), "order.jsonl:1: field 'option_order': expected a permutation"),
    ("split-target-unknown", E("--split", "{target-unknown.jsonl}"), "target-unknown.jsonl:1: field 'target'"),
    ("split-chain", E("--split", "{chain.jsonl}"), "chain.jsonl:1: field 'attack_chain': does not rebuild"),
    ("split-gold", E("--split", "{gold.jsonl}"), "gold.jsonl:1: field 'gold': label out of range"),
    # read-only commands
    ("compare-missing", ["compare", "{root}/nothing", "{search}"], "no such run directory"),
    ("compare-not-run", ["compare", "{stranger}", "{search}"], "is not a run directory"),
    ("compare-corrupt-trace", ["compare", "{corrupt-trace}", "{search}"], "trace.jsonl:2: unreadable record"),
    ("compare-corrupt-config", ["compare", "{corrupt-config}", "{search}"], "unreadable run configuration"),
    ("report-corrupt-score", ["report", "{corrupt-score}", "--out", "{root}/r.html"], "score.json:1: malformed JSON"),
    ("report-corrupt-trace", ["report", "{corrupt-trace}", "--out", "{root}/r.html"], "trace.jsonl:2: unreadable"),
    ("report-out-directory", ["report", "{search}", "--out", "{stranger}"], "a directory; give the HTML file"),
    ("report-out-suffix", ["report", "{search}", "--out", "{root}/r.txt"], "expected an .html file name"),
    ("report-missing-run", ["report", "{root}/nothing", "--out", "{root}/r.html"], "no score.json"),
    ("report-no-run", ["report"], "Missing argument"),
    ("mutate-operator", ["mutate", "--operator", "textbuger"], "Did you mean 'textbugger'"),
    ("mutate-setting-type", ["mutate", "--set", "positions=abc"], "(textbugger).positions: expected an integer"),
    ("mutate-setting-unknown", ["mutate", "--set", "colour=red"], "unknown setting 'colour'"),
    ("mutate-item", ["mutate", "--item", "999"], "--item 999: no such item"),
    ("mutate-n-zero", ["mutate", "--n", "0"], "Invalid value for '--n'"),
    ("tune-space", ["tune", "--space", "nope", "--model", "{model}"], "unknown tuning space 'nope'"),
    ("tune-trials", ["tune", "--space", "operator_families", "--trials", "0"], "Invalid value for '--trials'"),
    ("tune-budget", ["tune", "--space", "operator_families", "--budget", "1"], "Invalid value for '--budget'"),
    ("tune-space-file", ["tune", "--space", "{syntax.yaml}", "--model", "{model}"], "syntax.yaml:3: YAML error"),
    ("finetune-policy", ["finetune", "--out", "{root}/a", "--policy", "gould"], "Did you mean 'gold'"),
    ("finetune-share", ["finetune", "--out", "{root}/a", "--prefix-share", "2"], "--prefix-share must lie in"),
    ("finetune-planted-share-policy", ["finetune", "--out", "{root}/a", "--planted-share", "0.5"],
     "--planted-share needs --policy planted"),
    ("finetune-planted-share-range", ["finetune", "--out", "{root}/a", "--policy", "planted", "--planted-categories",
                                      "Age", "--planted-share", "1.5"], "--planted-share must lie in"),
    ("finetune-orders", ["finetune", "--out", "{root}/a", "--orders-per-item", "4"],
     "Invalid value for '--orders-per-item'"),
    ("report-old-score", ["report", "{old-score}", "--out", "{root}/r.html"], "written by an older flexsearch"),
    ("finetune-into-search", ["finetune", "--out", "{search}", "--eval-share", "0"],
     "not empty and not written by flexsearch (no recipe.json)"),
    ("tune-into-search", ["tune", "--space", "operator_families", "--out", "{search}"], "holds a 'search' run"),
    ("export-into-foreign-folder", ["export", "{search}", "{stranger}"],
     "not empty and not written by flexsearch (no export.json)"),
    ("compare-into-foreign-folder", ["compare", "{search}", "{search}", "--out", "{stranger}"],
     "not empty and not written by flexsearch (no compare.json)"),
    ("compare-out-file", ["compare", "{search}", "{search}", "--out", "{data.txt}"], "a file, not a folder"),
    ("report-over-foreign-html", ["report", "{search}", "--out", "{stranger}/page.html"],
     "was not written by flexsearch"),
    ("report-twin-over-foreign-md", ["report", "{search}", "--out", "{stranger}/README.html"],
     "--out (its .md twin)"),
    ("finetune-over-foreign-adapter", ["finetune", "--out", "{foreign-adapter}", "--limit", "12", "--eval-share", "0"],
     "not empty and not written by flexsearch (no recipe.json)"),
    ("export-format", ["export", "{search}", "{root}/a", "--to", "csv"], "--to: unknown export format 'csv'"),
    ("export-not-search", ["export", "{eval}", "{root}/a"], "not a finished search run"),
    ("export-missing-run", ["export", "{root}/nothing", "{root}/a"], "not a finished search run"),
    ("export-into-run", ["export", "{search}", "{eval}"], "not empty and not written by flexsearch (no export.json)"),
    ("export-name", ["export", "{search}", "{root}/a", "--name", "my-task"], "--name 'my-task': use letters"),
    # output paths that cannot be made, unsafe or damaged weights, control characters (issue 25)
    ("out-under-a-file", S("--out", "{data.txt}/run"), "data.txt is a file, not a folder"),
    ("out-symlink-loop", S("--out", "{loop.jsonl}"), "loop.jsonl is a symbolic link that leads nowhere"),
    ("evaluate-out-under-a-file", E("--data", "seed", "--out", "{data.txt}/run"), "is a file, not a folder"),
    ("export-under-a-file", ["export", "{search}", "{data.txt}/lm-eval"], "data.txt is a file, not a folder"),
    ("compare-under-a-file", ["compare", "{search}", "{search}", "--out", "{data.txt}/c"], "is a file, not a folder"),
    ("report-under-a-file", ["report", "{search}", "--out", "{data.txt}/r.html"], "is a file, not a folder"),
    ("finetune-under-a-file", ["finetune", "--out", "{data.txt}/adapter"], "is a file, not a folder"),
    ("tune-under-a-file", ["tune", "--space", "operator_families", "--out", "{data.txt}/t"], "is a file, not a folder"),
    ("model-pickle-weights", S("--model", "{pickle-model}"), "a pickle holding more than tensors, refused"),
    ("model-garbage-safetensors", S("--model", "{garbage-model}"), "cannot load it as a causal LM (Error while"),
    ("model-truncated-gguf", S("--model", "{truncated.gguf}"), "cannot convert this GGUF file"),
    ("adapter-declares-another-base", S("--adapter", "{other-base-adapter}"),
     "declares base model 'meta-llama/Llama-3.2-1B', not this target"),
    ("escape-sequence-in-an-option", S("--objective", "\x1b[2Jstereo"), "unknown objective '\\x1b[2Jstereo'"),
    ("escape-sequence-in-a-path", S("--data", "{root}/\x1b]0;title\x07.jsonl"), "\\x1b]0;title\\x07.jsonl: file"),
    # issue 46's classes: the same item twice, files with no item, compressed data, a key given twice, a limit
    # integers no run can use (a limit beyond the data is a cap, not an error: test_a_limit_beyond_the_data_...)
    ("data-duplicate-ids", S("--data", "{duplicate-ids.jsonl}"),
     "duplicate-ids.jsonl:2: field 'example_id': duplicate item id 'Age-age-phone-ambig-neg'"),
    ("data-empty-file", S("--data", "{empty.jsonl}"), "empty.jsonl: no usable items"),
    ("data-blank-lines-only", E("--data", "{blank-lines.jsonl}"), "blank-lines.jsonl: no usable items"),
    ("data-gzip", S("--data", "{seed.jsonl.gz}"), "seed.jsonl.gz: a compressed file (.gz): decompress it first "
                                                  "(gunzip)"),
    ("config-duplicate-key", S("--config", "{duplicate-key.yaml}"),
     "duplicate-key.yaml:5: YAML error: key 'budget' is given twice (first at line 2)"),
    ("set-duplicate-key", S("--set", "operators=[{name: persona, n: 2, n: 3}]"),
     "--set operators=[{name: persona, n: 2, n: 3}]: the value is not valid YAML (key 'n' is given twice"),
    ("budget-too-large", S("--budget", str(10**30)), "--budget: field 'budget': must be at most 2147483647"),
    ("limit-too-large", E("--limit", str(2**31)), "'--limit': Input should be less than or equal to 2147483647"),
    ("set-too-large", S("--set", f"population={10**30}"), "field 'population': must be at most 2147483647"),
    ("config-too-large", S("--set", f"scoring.batch_size={2**63}"), "field 'scoring.batch_size': must be at most"),
    # a setting the search's method never reads (issue 46: refused, not silently ignored)
    ("set-ignored-beam-width", S("--set", "beam_width=3"), "--set beam_width=3: field 'beam_width': is read by "
     "method beam only; this search's method is learned, which would ignore it"),
    ("set-ignored-importance", S("--set", "importance=gradient"), "field 'importance': is read by method greedy "
     "only"),
    ("set-ignored-population", S("--config", "textbugger", "--set", "population=4"), "field 'population': is read "
     "by methods evolutionary, learned and random only; this search's method is greedy"),
    ("set-ignored-family-share", S("--method", "beam", "--set", "family_share=0.5"), "field 'family_share': is "
     "read by method learned only; this search's method is beam"),
]


def _fill(args: list[str], world: dict[str, Path]) -> list[str]:
    """Replaces {name} by the world's path of that name (other braces, YAML's, stay)."""
    return [re.sub(r"\{([\w.-]+)\}", lambda m: str(world.get(m.group(1), m.group(0))), a) for a in args]


@pytest.mark.parametrize(("args", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_two_and_changes_nothing(world, args, message):
    existing = [world["search"], world["eval"], world["corrupt-trace"], world["corrupt-score"],
                world["corrupt-config"], world["old-score"], world["stranger"], world["trace-no-chain"],
                world["foreign-adapter"], world["trace-other-config"], world["pipe-trace-run"]]
    before = snapshot(existing)
    result = runner.invoke(app, _fill(args, world))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.output
    assert not any(c in result.output for c in "\x00\x07\x1b\r")  # no raw control character reaches the terminal
    assert snapshot(existing) == before
    assert not (world["root"] / "new-run").exists() and not (world["root"] / "new-eval").exists()
    assert not (world["root"] / "r.html").exists() and not (world["root"] / "a").exists()


@pytest.mark.parametrize(("name", "codec"), [
    ("utf8-bom.jsonl", "utf-8-sig"), ("utf16-bom.jsonl", "utf-16"), ("utf16be-bom.jsonl", "utf-16"),
    ("utf32-bom.jsonl", "utf-32"), ("utf32be-bom.jsonl", "utf-32"), ("utf8-bom.csv", "utf-8-sig")])
def test_a_file_with_a_byte_order_mark_reads_through_the_cli_as_its_plain_utf8_twin(world, name, codec, tmp_path):
    twin = tmp_path / f"plain{Path(name).suffix}"
    twin.write_text(world[name].read_bytes().decode(codec), encoding="utf-8")  # Python's codecs drop the BOM

    def predictions(data: Path, out: Path) -> list[dict]:
        result = runner.invoke(app, ["evaluate", "--model", str(world["model"]), "--data", str(data),
                                     "--device", "cpu", "--out", str(out)])
        assert result.exit_code == 0, result.output
        return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]

    read = predictions(world[name], tmp_path / "bom")
    assert len(read) == 1 and read == predictions(twin, tmp_path / "plain")  # same item, same text, same scores


def test_a_limit_beyond_the_data_takes_every_item_and_the_run_says_how_many(world, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["evaluate", "--model", str(world["model"]), "--data", str(world["utf8-bom.jsonl"]),
                                 "--limit", "1000", "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 1  # --limit caps; the file holds one item
    assert json.loads((out / "score.json").read_text())["n_items"] == 1


def test_crlf_line_endings_read_as_their_lf_twin(world, tmp_path):
    from flexsearch.data.seed import seed_records

    records = [json.dumps(r) for _, r in seed_records()[:3]]
    (tmp_path / "crlf.jsonl").write_bytes("\r\n".join(records).encode() + b"\r\n")
    (tmp_path / "lf.jsonl").write_text("\n".join(records) + "\n")
    runs = []
    for name in ("crlf", "lf"):
        result = runner.invoke(app, ["evaluate", "--model", str(world["model"]), "--data",
                                     str(tmp_path / f"{name}.jsonl"), "--device", "cpu", "--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        runs.append((tmp_path / name / "predictions.jsonl").read_text())
    assert runs[0] == runs[1] and len(runs[0].splitlines()) == 3


def test_an_unreadable_data_file_is_one_line_and_writes_nothing(world, tmp_path, monkeypatch):
    data = tmp_path / "locked.jsonl"
    data.write_text(json.dumps(_seed_record()) + "\n")
    data.chmod(0)
    if os.geteuid() == 0:  # root reads any file: deny it as the kernel denies anyone else
        read_bytes = Path.read_bytes

        def denied(path: Path) -> bytes:
            if path == data:
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return read_bytes(path)

        monkeypatch.setattr(Path, "read_bytes", denied)
    result = runner.invoke(app, _fill(S("--data", str(data), "--out", str(tmp_path / "run")), world))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0] == f"error: {data}: cannot read file (Permission denied)" and not (tmp_path / "run").exists()


def test_there_are_at_least_sixty_cases():
    assert len(CASES) >= 60 and len({c[0] for c in CASES}) == len(CASES)


def test_a_second_process_on_one_run_directory_is_refused(world):
    before = snapshot([world["search"]])
    with RunDirectory(world["search"], "search"):
        result = runner.invoke(app, _fill(S("--out", "{search}", "--budget", "6", "--limit", "4"), world))
        assert result.exit_code == 2 and "in use by another flexsearch process (pid " in result.output
    (world["search"] / ".lock").unlink(missing_ok=True)
    assert snapshot([world["search"]]) == before


def test_too_long_prompts_are_skipped_and_counted(world, tmp_path):
    data = tmp_path / "mixed.jsonl"
    normal = _seed_record()
    data.write_text(world["long.jsonl"].read_text() + json.dumps({**normal, "example_id": "ok"}) + "\n")
    out = tmp_path / "run"
    result = runner.invoke(app, _fill(["evaluate", "--model", "{model}", "--data", str(data), "--out", str(out),
                                       "--device", "cpu"], world))
    assert result.exit_code == 0, result.output
    score = json.loads((out / "score.json").read_text())
    assert score["n_items"] == 1 and score["skipped"] == 1
    assert any("prompt longer than" in reason for reason in score["skipped_reasons"])


def test_read_only_commands_leave_a_torn_trace_alone_and_resume_repairs_it(world, tmp_path):
    run = tmp_path / "torn"
    shutil.copytree(world["search"], run)
    with (run / "trace.jsonl").open("a") as handle:
        handle.write('{"kind": "item", "objec')  # what a kill mid-write leaves
    torn = (run / "trace.jsonl").read_bytes()
    assert runner.invoke(app, ["compare", str(run), str(world["search"])]).exit_code == 0
    assert (run / "trace.jsonl").read_bytes() == torn
    result = runner.invoke(app, _fill(S("--out", str(run), "--budget", "6", "--limit", "4"), world))
    assert result.exit_code == 0, result.output
    assert (run / "trace.jsonl").read_bytes() == torn[: torn.rindex(b"\n") + 1]


def test_offline_unknown_hub_id_fails_fast_in_one_line(world):
    import time

    started = time.perf_counter()
    result = runner.invoke(app, _fill(S("--model", "no-such-org/no-such-model-xyz"), world))
    assert result.exit_code == 2 and "not in the Hugging Face cache" in result.output, result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1
    assert time.perf_counter() - started < 30


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_on_a_machine_without_one_is_one_line(world):
    result = runner.invoke(app, _fill(S("--device", "cuda"), world))
    assert result.exit_code == 2 and "no CUDA device is available on this machine" in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1


def test_a_read_only_output_folder_is_refused_before_anything_is_written(world, monkeypatch):
    """EROFS cannot be made without a mount; the file system's answer is stood in for, the rest is real."""
    import os

    from flexsearch.results import run_dir as runio

    read_only = world["root"] / "mounted-read-only"
    read_only.mkdir(exist_ok=True)
    real_access, real_statvfs = os.access, os.statvfs

    class ReadOnlyStat:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(runio.os, "access", lambda p, mode: Path(p) != read_only and real_access(p, mode))
    monkeypatch.setattr(runio.os, "statvfs", lambda p: ReadOnlyStat() if Path(p) == read_only else real_statvfs(p))
    for args in (S("--out", str(read_only / "run")), ["export", str(world["search"]), str(read_only / "x")],
                 ["report", str(world["search"]), "--out", str(read_only / "r.html")]):
        result = runner.invoke(app, _fill(args, world))
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(lines) == 1, result.output
        assert f"cannot write in {read_only} (a read-only file system)" in lines[0]
    assert list(read_only.iterdir()) == []


def test_a_full_disk_mid_search_is_one_line_exit_one_and_the_rerun_resumes(world, monkeypatch, tmp_path):
    import errno

    from flexsearch.pipeline import search as pipeline

    out = tmp_path / "full-disk"
    real_append, calls = pipeline.append_jsonl, []

    def fills_up(path: Path, records) -> None:
        calls.append(path)
        if len(calls) > 1:  # the first batch is kept, the second finds the disk full
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_append(path, records)

    monkeypatch.setattr(pipeline, "append_jsonl", fills_up)
    args = _fill(S("--out", str(out), "--limit", "4", "--budget", "6", "--set", "item_batch=2"), world)
    result = runner.invoke(app, args)
    lines = [line for line in result.output.splitlines() if line.strip() and "error" in line]
    assert result.exit_code == 1, result.output
    assert lines == [f"error: {out / 'trace.jsonl'}: No space left on device; free space and rerun the same command "
                     "(a search or evaluate resumes where it stopped)"]
    kept = (out / "trace.jsonl").read_text()
    assert kept and not (out / "split.jsonl").exists() and not (out / ".lock").exists()
    monkeypatch.setattr(pipeline, "append_jsonl", real_append)
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (out / "trace.jsonl").read_text().startswith(kept)
    assert len((out / "split.jsonl").read_text().splitlines()) == 4


def test_a_category_written_in_tex_is_plain_text_in_the_report(world, tmp_path):
    from flexsearch.data.seed import seed_records

    records = [{**record, "category": f"Age {k % 2} $x^^$ $\\nocommand{{x}}$"}  # broken mathtext
               for k, (_, record) in enumerate(seed_records()[:6])]
    data = tmp_path / "tex.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    run = tmp_path / "run"
    result = runner.invoke(app, _fill(S("--data", str(data), "--out", str(run), "--limit", "6", "--budget", "6"),
                                      world))
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["report", str(run), "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert "Age 1 $x^^$ $\\nocommand{x}$" in (tmp_path / "r.md").read_text()
    assert "ASR per category" in (tmp_path / "r.html").read_text()  # the plot that shows the category names


@pytest.mark.parametrize("bomb", [
    # a 10-line mapping alias bomb: 9**9 nodes if expanded
    "".join(f"l{k}: &l{k} {{{', '.join(f'k{j}: *l{k - 1}' for j in range(9))}}}\n" if k else "l0: &l0 {a: b}\n"
            for k in range(10)),
    # a list bomb inside a constraint's model setting (expanded by dataclasses.asdict once)
    "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
    "constraints: [{name: similarity, model: [*d, *d, *d, *d, *d, *d, *d, *d, *d]}]\n",
], ids=["mapping-bomb", "list-bomb-in-a-constraint"])
def test_yaml_bombs_are_refused_at_once(bomb, tmp_path):
    """Each is refused in well under a second; the alarm only guards against a hang."""
    import signal
    import time

    from flexsearch.config import load_config
    from flexsearch.errors import FlexsearchError

    path = tmp_path / "bomb.yaml"
    path.write_text(bomb)
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the YAML bomb hung the config loader"))
    signal.alarm(60)
    started = time.perf_counter()
    try:
        with pytest.raises(FlexsearchError, match="aliases .* are not allowed"):
            load_config(str(path))
    finally:
        signal.alarm(0)
    print(f"refused in {time.perf_counter() - started:.4f} s")
