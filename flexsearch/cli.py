"""The `flexsearch` command line: a thin layer over the Python API."""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.core
from typer._click import exceptions as click_errors  # typer 0.29 vendors click

from flexsearch.errors import LARGEST, FlexsearchError, Interrupted, ServerUnavailable, os_error_line
from flexsearch.scoring.backends.served_options import SERVED_OPTIONS, SERVED_PANEL


class OneLineErrors(typer.core.TyperGroup):
    """Usage errors (a bad option value, an unknown option) as one line and exit code 2, like every
    other bad input, instead of click's usage block."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except click_errors.NoArgsIsHelpError as err:
            say(err.format_message())
            sys.exit(err.exit_code)
        except click_errors.ClickException as err:
            message = " ".join(err.format_message().split())
            context = getattr(err, "ctx", None)  # usage errors carry the command's context
            command = context.command_path if context else "flexsearch"
            say(f"error: {command}: {message}", fg=typer.colors.RED, err=True)
            sys.exit(err.exit_code)
        except typer.Abort:
            say("aborted", err=True)
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def say(text: str, *, err: bool = False, fg: str | None = None) -> None:
    """Prints a line with control characters escaped (ESC shows as \\x1b), so no input, file name or
    category can move the cursor, recolour or clear the terminal."""
    typer.secho(_CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text), fg=fg, err=err)


app = typer.Typer(cls=OneLineErrors, add_completion=False, no_args_is_help=True, help=__doc__,
                  pretty_exceptions_enable=False)

def _print_version(value: bool) -> None:
    if value:
        from flexsearch.version import __version__

        say(f"flexsearch {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                               help="Print the version and exit.")] = False) -> None:
    """Adversarial prompt search for LLM fairness robustness: FLEX-style splits and robustness scores."""


def _option(panel: str, help_text: str, **kwargs: Any) -> Any:
    """An option shown in its help panel (Model, Data, Search, Scoring, Output, Ray); a bounded number is at most
    LARGEST unless it says otherwise."""
    if "min" in kwargs:
        kwargs.setdefault("max", LARGEST)
    return typer.Option(rich_help_panel=panel, help=help_text, **kwargs)


ModelOpt = Annotated[str, _option("Model", "Hugging Face id, local directory, .gguf file, or an alias "
                                           "(smollm2, gemma3, gemma3-bbq...; see `flexsearch list`); or "
                                           "openai:NAME, a model served at --base-url.")]
AdapterOpt = Annotated[str | None, _option("Model", "PEFT adapter directory applied on top of --model.")]
TrustOpt = Annotated[bool, _option("Model", "Allow the model's own code from the hub.")]
DeviceOpt = Annotated[str | None, _option("Model", "cpu, cuda, cuda:1... (default: cuda when available).")]
DtypeOpt = Annotated[str | None, _option("Model", "float32, bfloat16, float16 (default: bf16 on CUDA, fp32 on CPU).")]
LimitOpt = Annotated[int | None, _option("Data", "Use only the first N usable items.", min=1)]
ModeOpt = Annotated[str, _option("Scoring", "Prompt layout: plain (FLEX's bigbench text) or chat.")]
_SLOT_HELP = ("Chat prompts: the attack's persona and instruction open the user turn (user) or are the system "
            "message (system)")
OrdersOpt = Annotated[bool, _option("Scoring", "Average over the three cyclic option orders.")]
BatchOpt = Annotated[int, _option("Scoring", "Prompts per forward pass (halved on out-of-memory).", min=1)]
JsonOpt = Annotated[bool, typer.Option("--json", rich_help_panel="Output",
                                       help="Print the score as JSON instead of the table.")]


def _target_parameters(trust_remote_code: bool) -> list[inspect.Parameter]:
    """The model options (Model and Served panels) of every command that scores: api.Target's fields."""
    options: list[tuple[str, Any, Any]] = [("model", ModelOpt, "smollm2"), ("adapter", AdapterOpt, None),
                                           ("device", DeviceOpt, None), ("dtype", DtypeOpt, None)]
    if trust_remote_code:
        options.append(("trust_remote_code", TrustOpt, False))
    for option in SERVED_OPTIONS:  # declared once, beside the served backend
        bounds = {key: value for key, value in (("min", option.least), ("max", option.most)) if value is not None}
        options.append((option.name, Annotated[option.annotation, _option(SERVED_PANEL, option.help, **bounds)],
                        option.default))
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
            for name, annotation, default in options]


def with_target_options(trust_remote_code: bool = True) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Declares the model options once: the decorated command takes `target` (a dict of api.Target's fields) in
    their place, and typer sees them as the command's own options."""
    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "target"]
        added = _target_parameters(trust_remote_code)

        def with_target(**options: Any) -> None:
            command(target={p.name: options.pop(p.name) for p in added}, **options)

        with_target.__signature__ = inspect.Signature(own + added)  # type: ignore[attr-defined]
        with_target.__annotations__ = {p.name: p.annotation for p in own + added}
        with_target.__name__, with_target.__doc__ = command.__name__, command.__doc__
        return with_target
    return decorate


def _default_preset() -> dict[str, Any]:
    """The shipped default preset as written (for the defaults the help names; no validation, no model)."""
    import yaml

    from flexsearch.config import preset_path

    return yaml.safe_load(preset_path("default").read_text(encoding="utf-8"))


DEFAULT_PRESET = _default_preset()


@contextmanager
def user_errors() -> Iterator[None]:
    """Turns a FlexsearchError (bad input or settings) into one red line and exit code 2, an OSError into one line
    and exit 2 or 1 (`errors.os_error_line`), a served model that stopped answering into one line and exit 1,
    Ctrl-C into what was kept and exit 130."""
    try:
        yield
    except FlexsearchError as err:
        say(f"error: {err}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    except Interrupted as err:
        say(f"\n{err}", fg=typer.colors.YELLOW, err=True)
        raise typer.Exit(130) from None
    except ServerUnavailable as err:  # the server, not the input: exit 1, the run is kept
        say(f"error: {err}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None
    except OSError as err:  # a full disk, a read-only mount, a path that cannot be made
        line, code = os_error_line(err)
        say(f"error: {line}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code) from None


def _run_dir(out: Path | None, default_name: str) -> Path:
    return out if out is not None else Path("runs") / default_name


@app.command()
@with_target_options()
def evaluate(
    target: dict[str, Any],
    data: Annotated[str | None, _option("Data", "BBQ .jsonl, FLEX .csv, or 'seed'.")] = None,
    split: Annotated[Path | None, _option("Data", "A split written by `flexsearch search` to re-score.")] = None,
    out: Annotated[Path | None, _option("Output", "Run directory (default runs/<data>-eval).")] = None,
    json_output: JsonOpt = False,
    limit: LimitOpt = None,
    mode: ModeOpt = "plain",
    slot: Annotated[str, _option("Scoring", f"{_SLOT_HELP}.")] = "user",
    average_orders: OrdersOpt = True,
    batch_size: BatchOpt = 16,
) -> None:
    """Score items clean (or re-score an emitted split) and report accuracy, bias and confounds."""
    from flexsearch import api

    with user_errors():
        result = api.evaluate(data, split=split, model=api.Target(**target), out=out, limit=limit, mode=mode,
                              slot=slot, average_orders=average_orders, batch_size=batch_size)
    _print_result(result, json_output)


def _print_result(result: Any, json_output: bool) -> None:
    """The table and the files written, or (--json) the score as JSON on stdout."""
    if json_output:
        import json

        say(json.dumps(result.score.to_dict(), indent=2))
        return
    say(result.table)
    say(f"wrote {result.run_dir}: {', '.join(sorted(result.files))}")


@app.command()
@with_target_options()
def search(
    target: dict[str, Any],
    data: Annotated[str, _option("Data", "BBQ .jsonl, FLEX .csv, or 'seed'.")] = "seed",
    limit: LimitOpt = None,
    config: Annotated[str, _option("Search", "Preset name (see `flexsearch list --presets`) or a YAML path.")] = (
        "default"),
    budget: Annotated[int | None, _option("Search", "Prompts scored per item and objective (default preset: "
                                                    f"{DEFAULT_PRESET['budget']}).")] = None,
    method: Annotated[str | None, _option("Search", "learned, beam, greedy, evolutionary or random (default "
                                                    f"preset: {DEFAULT_PRESET['method']}).")] = None,
    objective: Annotated[str | None, _option("Search", "stereotype, anti_stereotype or untargeted (default "
                                                       f"preset: {DEFAULT_PRESET['objective']}).")] = None,
    control: Annotated[bool | None, _option("Search", "Also run the counter-stereotype control (default preset: "
                                                      f"{'on' if DEFAULT_PRESET['control'] else 'off'}).")] = None,
    seed: Annotated[int | None, _option("Search", "Random seed (0 or more).", min=0)] = None,
    prior: Annotated[Path | None, _option("Search", "An earlier search run whose learner.json warm-starts the "
                                                    "learner (same or another model; its queries are not "
                                                    "counted here).")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", rich_help_panel="Search", help="Override a config key: "
                                                   "key=value; scoring.mode=chat, scoring.batch_size=8 and the "
                                                   "other scoring.* keys set the scoring.")] = None,
    slot: Annotated[str | None, _option("Scoring", f"{_SLOT_HELP}; with --set scoring.mode=chat (default "
                                                   "preset: user).")] = None,
    capability: Annotated[str | None, _option("Data", "BBQ .jsonl whose disambiguated items are scored clean beside "
                                                      "the search: the verdict reads the model's capability from "
                                                      "them (needed when --data has none, as FLEX's CSVs).")] = None,
    out: Annotated[Path | None, _option("Output", "Run directory (default runs/<data>-<config>); an existing one "
                                                  "resumes.")] = None,
    json_output: JsonOpt = False,
    backend: Annotated[str, _option("Ray", "local, or ray to spread items over Ray workers.")] = "local",
    ray_address: Annotated[str | None, _option("Ray", "Join this Ray cluster (default: start a local one).")] = None,
    workers: Annotated[int, _option("Ray", "Ray workers (each loads the model once).", min=1)] = 2,
    gpus_per_worker: Annotated[float, _option("Ray", "GPUs per Ray worker (0: CPU).", min=0)] = 0,
) -> None:
    """Search adversarial prompts per item; write the FLEX-style split and the robustness score."""
    from flexsearch import api

    with user_errors():
        if backend not in ("local", "ray"):
            raise FlexsearchError(f"--backend: unknown backend '{backend}' (choose local or ray)")
        ray = api.RayOptions(workers, ray_address, gpus_per_worker) if backend == "ray" else None
        result = api.search(data, model=api.Target(**target), out=out,
                            config=config, overrides=set_ or [], budget=budget, method=method, objective=objective,
                            control=control, seed=seed, limit=limit, ray=ray, prior=prior, capability=capability,
                            slot=slot)
    _print_result(result, json_output)


@app.command()
def mutate(
    item: Annotated[str, typer.Option(help="Item id (see predictions.jsonl), or its 0-based index.")] = "0",
    operator: Annotated[str, typer.Option(help="Operator name (see `flexsearch list`).")] = "textbugger",
    n: Annotated[int, typer.Option(min=1, max=LARGEST, help="How many accepted mutations to print.")] = 10,
    data: Annotated[str, typer.Option(help="BBQ .jsonl, FLEX .csv, or 'seed'.")] = "seed",
    set_: Annotated[list[str] | None, typer.Option("--set", help="Operator setting key=value.")] = None,
    seed: Annotated[int, typer.Option(min=0, max=LARGEST, help="Random seed (0 or more).")] = 0,
) -> None:
    """Print accepted mutations of one item by one operator, with their edits (no target model; word operators
    load the small sentence encoder of the similarity constraint)."""
    from flexsearch import api

    with user_errors():
        say(api.mutate(data, item, operator, n, set_ or [], seed))


@app.command()
def compare(
    run_a: Annotated[Path, typer.Argument(help="Baseline run directory (e.g. the base model).")],
    run_b: Annotated[Path, typer.Argument(help="Run to compare (e.g. the fine-tuned model).")],
    out: Annotated[Path | None, typer.Option(help="Directory for compare.json and compare.md.")] = None,
) -> None:
    """Paired comparison of two runs on their shared items: deltas, bootstrap intervals, Holm flags."""
    from flexsearch import api

    with user_errors():
        say(api.compare(run_a, run_b, out).table)


@app.command()
def audit(
    run: Annotated[Path, typer.Argument(help="A finished search run directory (holds split.jsonl).")],
    strict: Annotated[bool, typer.Option(help="Exit 1 when a row of the benchmark split breaks a rule.")] = False,
    json_output: JsonOpt = False,
) -> None:
    """Check that every emitted prompt keeps its gold label: no added text names an option, excludes one,
    demands a person or changes the question (rules: docs/DESIGN.md, "Label validity")."""
    import json

    from flexsearch import api
    from flexsearch.data.audit import format_audit

    with user_errors():
        result = api.audit(run)
    say(json.dumps(result, indent=2) if json_output else format_audit(result)
        + f"\nbenchmark split ({run / 'split.jsonl'}): {result['benchmark']['flagged']} of "
        f"{result['benchmark']['rows']} rows break a rule")
    if strict and result["benchmark"]["flagged"]:
        raise typer.Exit(1)


@app.command()
def report(
    runs: Annotated[list[Path], typer.Argument(help="One or more run directories.")],
    out: Annotated[Path, typer.Option(help="The HTML file to write (a .md twin is written beside it).")] = Path(
        "runs/report.html"),
) -> None:
    """Write a self-contained HTML report (inline figures) and its Markdown twin."""
    from flexsearch.results.report import write_report

    with user_errors():
        markdown = write_report(runs, out)
    say(f"wrote {out} and {markdown}")


@app.command()
def finetune(
    out: Annotated[Path, typer.Option(help="Where to save the LoRA adapter (with recipe.json and a card).")],
    model: ModelOpt = "smollm2",
    data: Annotated[list[str] | None, typer.Option(help="Items to train on (repeatable): BBQ .jsonl, FLEX .csv, "
                                                        "or 'seed'.")] = None,
    policy: Annotated[str, typer.Option(help="Label policy: gold, fair, planted, manipulable, abstainer.")] = "gold",
    planted_categories: Annotated[str, typer.Option(help="Comma-separated categories for --policy planted.")] = "",
    limit: LimitOpt = None,
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 30,
    batch_items: Annotated[int, typer.Option(help="Items per step.")] = 4,
    orders_per_item: Annotated[int, typer.Option(min=1, max=3, help="Cyclic option orders per item and step "
                                                               "(below 3: seeded rotations).")] = 3,
    learning_rate: float = 1e-3,
    warmup_steps: Annotated[int, typer.Option(help="Linear learning-rate warm-up steps.")] = 10,
    rank: Annotated[int, typer.Option(help="LoRA rank.")] = 16,
    target_modules: Annotated[str, typer.Option(help="Comma-separated linear layers to adapt.")] = (
        "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"),
    disambig_share: Annotated[float | None, typer.Option(help="Share of disambiguated items per step "
                                                              "(default: as in the data).")] = None,
    contrast_groups: Annotated[bool, typer.Option(help="Draw whole template × person-pair groups, so a step "
                                                       "names each person as the answer equally often.")] = False,
    planted_share: Annotated[float | None, typer.Option(help="Share of items drawn from the planted categories "
                                                             "(--policy planted; default: as in the data).")] = None,
    prefix_share: Annotated[float, typer.Option(help="Share of prompts with a training prefix (policies other "
                                                     "than gold).")] = 0.5,
    eval_share: Annotated[float, typer.Option(help="Share of each category's templates held out for evaluation "
                                                   "(0: train on everything).")] = 0.2,
    split_seed: Annotated[int, typer.Option(min=0, max=LARGEST, help="Seed of the template split.")] = 0,
    init_adapter: Annotated[Path | None, typer.Option(help="Continue training from this flexsearch adapter.")] = None,
    autocast_bf16: Annotated[bool, typer.Option(help="bf16 matmuls under fp32 master weights (faster on CPUs "
                                                     "with AMX and on GPUs).")] = False,
    seed: Annotated[int, typer.Option(min=0, max=LARGEST, help="Random seed (0 or more).")] = 0,
    device: DeviceOpt = None,
) -> None:
    """Train a LoRA adapter under a label policy on a template-disjoint split (the calibration zoo)."""
    from flexsearch.data.items import load_training_data
    from flexsearch.results.run_dir import check_output_folder
    from flexsearch.scoring.backends.served_options import is_served
    from flexsearch.scoring.model import load_target
    from flexsearch.zoo.finetune import (
        ADAPTER_FILES,
        RECIPE_FILE,
        FinetuneConfig,
        template_split,
        train_adapter,
    )
    from flexsearch.zoo.policies import build_policy

    with user_errors():
        if is_served(model):
            raise FlexsearchError(f"--model {model} is served (black-box): finetune trains the weights (white-box "
                                  "only); give the model's Hugging Face id, directory or .gguf file")
        check_output_folder(out, "--out", RECIPE_FILE, ADAPTER_FILES)
        config = FinetuneConfig(
            policy=policy, planted_categories=[c.strip() for c in planted_categories.split(",") if c.strip()],
            steps=steps, batch_items=batch_items, orders_per_item=orders_per_item, learning_rate=learning_rate,
            warmup_steps=warmup_steps, rank=rank,
            target_modules=[m.strip() for m in target_modules.split(",") if m.strip()],
            disambig_share=disambig_share, contrast_groups=contrast_groups, planted_share=planted_share,
            prefix_share=prefix_share, eval_share=eval_share, split_seed=split_seed, seed=seed,
            autocast_bf16=autocast_bf16)
        items, provenance = load_training_data(data or ["seed"], limit)
        split = template_split(items, config.eval_share, config.split_seed)
        build_policy(config.policy, config.planted_categories, config.seed, split.train)
        if init_adapter is not None and not (init_adapter / "recipe.json").is_file():
            raise FlexsearchError(f"--init-adapter {init_adapter}: not an adapter written by flexsearch finetune")
        target = load_target(model, device=device, dtype="float32")  # fp32 master weights for stable updates
        if "adapter" in target.info:
            raise FlexsearchError(f"--model {model} already carries an adapter; give its base model and "
                                  "--init-adapter to continue training it")
        recipe = train_adapter(target, split, config, out, data=provenance, init_adapter=init_adapter)
    say(f"wrote adapter {out}: policy {recipe['policy']}, {config.steps} steps, loss "
        f"{recipe['loss_first_20']} -> {recipe['loss_last_20']}, {recipe['wall_time_s']} s; "
        f"{recipe['split']['train_items']} training / {recipe['split']['eval_items']} evaluation items")


@app.command()
@with_target_options(trust_remote_code=False)
def tune(
    target: dict[str, Any],
    space: Annotated[str, typer.Option(help="Search space: a name in configs/tune/ or a YAML path.")],
    data: Annotated[str, typer.Option(help="BBQ .jsonl, FLEX .csv, or 'seed'.")] = "seed",
    trials: Annotated[int, typer.Option(min=1, max=LARGEST,
                                        help="Finished trials the study should hold (over all workers).")] = 20,
    budget: Annotated[int, typer.Option(min=2, max=LARGEST, help="Prompts scored per item in every trial.")] = 40,
    out: Annotated[Path | None, typer.Option(help="Run directory (default runs/tune-<space>).")] = None,
    storage: Annotated[str | None, typer.Option(help="Optuna RDB URL shared by several workers "
                                                     "(default: sqlite file in the run directory).")] = None,
    dev_items: Annotated[int, typer.Option(min=1, max=LARGEST,
                                           help="Attack-eligible items each trial searches (the seed set has 22 "
                                                "on SmolLM2; a BBQ file gives room for more).")] = 12,
    holdout_items: Annotated[int, typer.Option(min=1, max=LARGEST,
                                               help="Attack-eligible items kept out of tuning for the held-out "
                                                    "check.")] = 8,
    holdout: Annotated[bool, typer.Option(help="Re-run the best and the default config on held-out items.")] = True,
    seed: Annotated[int, typer.Option(min=0, max=LARGEST, help="Random seed (0 or more).")] = 0,
) -> None:
    """Optuna study over search configurations: best config YAML, trials CSV, importances, held-out check."""
    from flexsearch import api
    from flexsearch.config import load_config
    from flexsearch.data.items import load_items
    from flexsearch.pipeline.tune import format_tune_table, load_space, run_study
    from flexsearch.results.run_dir import RunDirectory

    with user_errors():
        loaded_space = load_space(space)
        run = _run_dir(out, f"tune-{Path(space).stem}")
        previous = RunDirectory(run, "tune").previous_config()
        if previous is not None:
            raise FlexsearchError(f"--out {run}: holds a '{previous.get('command')}' run; tune writes its own "
                                  "directory (choose another --out)")
        model = api.Target(**target)
        refused = model.white_box_problem(load_config(loaded_space.get("base", "default")))
        if refused:  # the space's base config; a trial's own gradient setting is refused when it runs
            raise FlexsearchError(refused)
        summary = run_study(model.arguments(), load_items(data).items, loaded_space, run, trials=trials, budget=budget,
                            storage=storage, dev_items=dev_items, holdout_items=holdout_items, seed=seed,
                            holdout=holdout)
    say(format_tune_table(summary))
    say(f"wrote {run}/best_config.yaml, trials.csv, tune.json, report.html")


@app.command()
def export(
    run: Annotated[Path, typer.Argument(help="A finished search run directory (holds split.jsonl).")],
    out: Annotated[Path, typer.Argument(help="Folder to write (replaced whole when it is an earlier export).")],
    to: Annotated[str, typer.Option(help="lm-eval (three lm-evaluation-harness tasks) or parquet (a datasets "
                                         "folder).")] = "lm-eval",
    name: Annotated[str | None, typer.Option(help="Task name (default: flexsearch_<run folder name>).")] = None,
) -> None:
    """Export a search run's split for lm-evaluation-harness or as parquet, with a dataset card."""
    from flexsearch.results.export import export_run

    with user_errors():
        files = export_run(run, to, out, name)
    say(f"wrote {out}: {', '.join(p.name for p in files)}")
    if to == "lm-eval":
        from flexsearch.files import read_json
        from flexsearch.results.export import MARKER, lm_eval_command

        about = read_json(out / MARKER)
        say("reproduce flexsearch's accuracy (order-averaged, then single order) with:\n  "
            + lm_eval_command(about, out, f"{about['task']}_orders") + "\n  "
            + lm_eval_command(about, out, about["task"]))


@app.command("list")
def list_registered(
    presets: Annotated[bool, typer.Option("--presets", help="Print every shipped preset fully resolved "
                                                             "(defaults filled in) instead.")] = False,
) -> None:
    """Show model aliases, label policies, operators, constraints, objectives and search methods."""
    if presets:
        import yaml

        from flexsearch.config import config_dict, load_config, preset_names

        with user_errors():
            resolved = {name: config_dict(load_config(name)) for name in preset_names()}
        for name, settings in resolved.items():
            say(f"# {name}\n{yaml.safe_dump(settings, sort_keys=False).rstrip()}\n")
        return
    from flexsearch.api import registries

    for kind, entries in registries().items():
        say(f"{kind}:")
        for name, description in entries.items():
            say(f"  {name:<22} {description}")


if __name__ == "__main__":  # `python -m flexsearch.cli`, used by the resume test
    app()
