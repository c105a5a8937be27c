# make train / make test: set up and run, on a fresh machine or in the virtual environment you have.
#
# With no virtual environment active, a .venv is created here (python3 -m venv) and used; with one active
# ($VIRTUAL_ENV), that one is used. torch is installed first when the environment has none: torch==2.13.0 from
# $(TORCH_INDEX), PyTorch's CPU-only wheels (PyPI's Linux wheel is the multi-GB CUDA build). For a CUDA build:
# make train TORCH_INDEX=https://download.pytorch.org/whl/cu128 (or install the torch you want first: an installed
# torch is kept). TORCH_INDEX= (empty) installs from pip's own configuration (an offline mirror, CI).
# Each install runs again only when pyproject.toml changes (a stamp file in the environment).

TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
ENV := $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV),.venv)
PY := $(ENV)/bin/python
PIP := $(PY) -m pip
# the overrides of make train (make train ARGS="trainer.max_steps=20 scheduler.warmup_steps=2")
ARGS ?=
# the default test tier, the slower one CI runs after it, and the heavy one (DeepSpeed engines on CPU ranks)
FAST := not slow and not distributed and not gpu
SLOW := (slow or distributed) and not gpu and not heavy
PYTEST := HF_HUB_OFFLINE=1 $(PY) -m pytest -q

.PHONY: help install train test test-slow test-heavy lint ci

help:
	@echo "make train   set up (.venv, CPU torch, the package) and run python -m hf_lightning.train +experiment=sft \$$ARGS"
	@echo "make test    set up with the test extra and run the default test tier ($(FAST))"
	@echo "make test-slow / test-heavy / lint / ci   the slower tiers (the test-full extra), ruff, what CI runs"

$(PY):
	python3 -m venv $(ENV)
	$(PIP) install -q --upgrade pip

# torch first, so that nothing the package pulls in brings a CUDA build
$(ENV)/.torch: | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==$(TORCH_VERSION) \
		$(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
	touch $@

$(ENV)/.hf_lightning: pyproject.toml $(ENV)/.torch
	$(PIP) install -q -e .
	touch $@

$(ENV)/.hf_lightning-test: pyproject.toml $(ENV)/.torch
	$(PIP) install -q -e ".[test]"
	touch $@

$(ENV)/.hf_lightning-test-full: pyproject.toml $(ENV)/.torch
	$(PIP) install -q -e ".[test-full]"
	touch $@ $(ENV)/.hf_lightning-test

install: $(ENV)/.hf_lightning

train: $(ENV)/.hf_lightning
	$(PY) -m hf_lightning.train +experiment=sft $(ARGS)

test: $(ENV)/.hf_lightning-test
	$(PYTEST) -m "$(FAST)"

test-slow: $(ENV)/.hf_lightning-test-full
	$(PYTEST) -m "$(SLOW)" --durations=40

test-heavy: $(ENV)/.hf_lightning-test-full
	$(PYTEST) -m heavy

lint: $(ENV)/.hf_lightning-test
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# CI (.ci/run): every optional group installed, ruff, the default tier, then the slower one
ci: $(ENV)/.hf_lightning-test-full lint test test-slow
