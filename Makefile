# The verbs of the project. Each makes its own virtualenv (.venv) and builds the extension in release
# mode, so `make demo` and `make test` work on a fresh machine with only Rust and Python 3.10+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS ?= dev,torch
export PYO3_PYTHON := $(abspath $(BIN)/python)
# The network has dropped downloads mid-wheel (torch's CUDA wheels run to GBs): pip resumes an interrupted
# download this many times, and retries a failed connection, before it gives up (older pips ignore these).
export PIP_RESUME_RETRIES := 20
export PIP_RETRIES := 10

.PHONY: convergence step-gradients equivalence figures demo test test-all test-rust test-python test-python-all test-clients-lowest test-gpu mypy fuzz \
	lint bench build venv clean wheel wheel-test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip "maturin>=1.9,<2"

venv: $(BIN)/python

# Builds the Rust extension (release) and installs it with the extras the tests need.
# (Twice more after a failure: the extras come from the network, which has dropped a download mid-wheel.)
DEVELOP := $(BIN)/maturin develop --release --quiet --extras $(EXTRAS)
build: venv
	$(DEVELOP) || $(DEVELOP) || $(DEVELOP)

demo: build
	$(BIN)/dflash-batch demo
	$(BIN)/dflash-batch analyze --demo

# The fast lane (≤ 6 minutes on 2 cores after `make demo`): the core's tests and every Python test but the
# slow and multi-process ones, over as many pytest workers as cores. Clippy and the rest: `make test-all`.
test: build test-rust test-python

# Everything CI runs (.ci/run): the fast lane's tests, the slow and multi-process ones (torchrun, kill -9
# and resume), lint and mypy, the adapters on the lowest client releases they support, and the wheel.
test-all: build test-rust lint mypy test-python-all test-clients-lowest wheel-test

test-rust:
	cargo test --package dflash-batch-core

test-python:
	DFLASH_REQUIRE_TORCH=1 $(BIN)/python -m pytest -n auto -m "not slow and not multiprocess"

test-python-all:
	DFLASH_REQUIRE_TORCH=1 $(BIN)/python -m pytest

# The tests that need CUDA (skipped elsewhere), for a machine with a GPU.
test-gpu: build
	DFLASH_REQUIRE_TORCH=1 $(BIN)/python -m pytest -m gpu

mypy: venv
	$(BIN)/mypy python/dflash_batch

# The adapters' tests on the lowest releases of their clients (tests/clients-lowest.txt), in a virtualenv
# of their own that imports this checkout's built extension.
LOWEST := .venv-lowest
# The same torch as .venv's (linked from it by tests/_lowest_venv.py, not downloaded again); an install
# interrupted by the network is tried again, twice.
LOWEST_INSTALL := $(LOWEST)/bin/pip install --quiet -r tests/clients-lowest.txt \
	"torch==$$($(BIN)/python -c 'import torch; print(torch.__version__.split("+")[0])')" \
	"numpy>=1.24" "pyarrow>=14" "tqdm>=4.60" "pytest>=8" "hypothesis>=6.100" "tokenizers>=0.15"
test-clients-lowest: build
	test -x $(LOWEST)/bin/python || $(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/pip install --quiet --upgrade pip
	$(BIN)/python tests/_lowest_venv.py "$$($(LOWEST)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	$(LOWEST_INSTALL) || $(LOWEST_INSTALL) || $(LOWEST_INSTALL)
	$(LOWEST)/bin/python -c "import site; open(site.getsitepackages()[0] + '/dflash_batch.pth', 'w').write('$(abspath python)\n')"
	$(LOWEST)/bin/python -c "import transformers, accelerate, trl, lightning, torchdata; print('lowest clients:', \
		transformers.__version__, accelerate.__version__, trl.__version__, lightning.__version__)"
	DFLASH_REQUIRE_TORCH=1 $(LOWEST)/bin/python -m pytest -q -m clients

# The adversarial suite at length (a few examples of it run in `make test`): FUZZ_EXAMPLES hypothesis
# examples per entry point, each a batch of cases in a capped child; tallies land in fuzz-report.jsonl.
FUZZ_EXAMPLES ?= 300
# Sequences of sampler and Loader operations the position state machine runs (300 in `make test`).
STATE_MACHINE_EXAMPLES ?= 2200
MIXTURE_EXAMPLES ?= 3000
# Sequences of the price state machine (rank prices between and inside epochs, elastic carries into a
# re-priced epoch, pickles) and mixtures whose epochs are formed again (a cycle holds): 60 and 15 in `make test`.
PRICE_MACHINE_EXAMPLES ?= 2000
MIXTURE_CYCLE_EXAMPLES ?= 2000
fuzz: build
	rm -f fuzz-report.jsonl
	DFLASH_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) DFLASH_FUZZ_REPORT=$(abspath fuzz-report.jsonl) \
		DFLASH_STATE_MACHINE_EXAMPLES=$(STATE_MACHINE_EXAMPLES) DFLASH_MIXTURE_EXAMPLES=$(MIXTURE_EXAMPLES) \
		DFLASH_PRICE_MACHINE_EXAMPLES=$(PRICE_MACHINE_EXAMPLES) DFLASH_MIXTURE_CYCLE_EXAMPLES=$(MIXTURE_CYCLE_EXAMPLES) \
		$(BIN)/python -m pytest -q -m fuzz
	$(BIN)/python tests/_adversary.py fuzz-report.jsonl
	DFLASH_MEMORY_SAMPLES=10000000 DFLASH_MEMORY_HEADROOMS=0,50,80,112,150,200,256,350,500,640 \
		$(BIN)/python -m pytest -q tests/base/test_memory.py

lint: venv
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(BIN)/ruff check python tests benchmarks examples
	$(BIN)/ruff format --check python tests benchmarks examples

bench:
	$(MAKE) build EXTRAS=dev,torch,bench
	$(BIN)/python benchmarks/plan.py
	$(BIN)/python benchmarks/mixing.py
	$(BIN)/python benchmarks/packing.py
	$(BIN)/python benchmarks/read.py
	$(BIN)/python benchmarks/loader.py
	$(BIN)/python benchmarks/mask.py
	$(BIN)/python benchmarks/shared.py
	$(BIN)/python benchmarks/windows.py --samples 3000000

# The convergence benchmark's quick run (≤ 10 min on 2 cores), recorded into docs/convergence/ and
# docs/figures.json, then written into the docs (docs/convergence.md).
convergence:
	$(MAKE) build EXTRAS=dev,torch,bench
	$(BIN)/python benchmarks/convergence.py --quick --out docs/convergence --json docs/figures.json
	$(BIN)/python benchmarks/_figures.py

# Batch quality, recorded into docs/ and docs/figures.json, then written into docs/convergence.md: the
# step-gradient table (≤ 10 min on 2 cores) with dflash_batch padded at other targets beside it and at six step
# shapes (what the padded default's rule rests on), and the equivalence of the held-out loss to a full shuffle
# (TOST; 5 strategies × 5 seeds, then 4 × 10 seeds, then the padded default and a shuffle × 20 seeds, the
# earlier seeds' runs reused).
step-gradients:
	$(MAKE) build EXTRAS=dev,torch,bench
	$(BIN)/python benchmarks/step_gradients.py --out docs/step_gradients --json docs/figures.json
	$(BIN)/python benchmarks/step_gradients.py \
		--strategies dflash_padded@0.98,dflash_padded@0.96,dflash_padded@0.95,dflash_padded@0.93 \
		--out docs/step_gradients/targets --json docs/figures.json --section step_gradients_targets
	$(BIN)/python benchmarks/step_gradients.py --shapes 1x1,1x2,1x4,2x4,1x8,1x16 \
		--strategies dflash_padded,dflash_padded@0.97,dflash_padded@0.95,dflash_padded@0.93,dflash_padded@0.9,dflash_padded@0.87 \
		--out docs/step_gradients/shapes --json docs/figures.json --section step_gradients_shapes
	$(BIN)/python benchmarks/_figures.py

equivalence:
	$(MAKE) build EXTRAS=dev,torch,bench
	$(BIN)/python benchmarks/convergence.py --quick --seeds 5 --epochs 3 --views tokens \
		--strategies shuffle,sorted,dflash_padded,dflash_packed,hf_length_grouped \
		--out docs/equivalence --json docs/figures.json --section equivalence
	$(BIN)/python benchmarks/convergence.py --quick --seeds 10 --epochs 3 --views tokens \
		--strategies shuffle,dflash_padded,dflash_padded@0.97,dflash_packed --reuse docs/equivalence/convergence.json \
		--out docs/equivalence/seeds_10 --json docs/figures.json --section equivalence_10
	$(BIN)/python benchmarks/convergence.py --quick --seeds 20 --epochs 3 --views tokens \
		--strategies shuffle,dflash_padded --reuse docs/equivalence/seeds_10/convergence.json \
		--out docs/equivalence/seeds_20 --json docs/figures.json --section equivalence_20
	$(BIN)/python benchmarks/_figures.py

# Reruns every benchmark the docs quote, records its figures in docs/figures.json, and writes them into
# README.md and docs/*.md (tests/package/test_docs_figures.py checks the pages against the file).
figures:
	$(MAKE) build EXTRAS=dev,torch,bench
	$(BIN)/python benchmarks/plan.py --json docs/figures.json
	$(BIN)/python benchmarks/mixing.py --json docs/figures.json
	$(BIN)/python benchmarks/packing.py --json docs/figures.json
	$(BIN)/python benchmarks/schedules.py --json docs/figures.json
	$(BIN)/python benchmarks/read.py --rows 100000 --json docs/figures.json
	$(BIN)/python benchmarks/loader.py --rows 100000 --json docs/figures.json
	$(BIN)/python benchmarks/mask.py --json docs/figures.json
	$(BIN)/python benchmarks/windows.py --samples 3000000 --json docs/figures.json
	$(BIN)/python benchmarks/lengths_pass.py --json docs/figures.json
	$(BIN)/python benchmarks/_figures.py

# An abi3 wheel (one for every CPython >= 3.10, tagged manylinux when maturin's audit passes) and a
# source distribution, in dist/.
wheel: venv
	rm -rf dist
	$(BIN)/maturin build --release --quiet --out dist
	$(BIN)/maturin sdist --out dist

# Installs the wheel into a fresh virtualenv whose PATH has no Rust toolchain, and runs the README's
# first example there (CI runs it after `make test`).
wheel-test: wheel
	$(BIN)/python tests/_wheel_check.py dist

clean:
	rm -rf $(VENV) $(LOWEST) target dist
