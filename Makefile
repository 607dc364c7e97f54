# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo test typecheck bench clean

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/polar-mq demo

# pytest exits 5 when no test ran; make fails on any non-zero exit, so that fails too.
test: $(VENV)/.installed
	$(PY) -m pytest $(PYTEST_ARGS)

# mypy.ini says what is checked how (strict on the pure packages: model, adapters, merge, ...).
typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

bench: $(VENV)/.installed
	$(PY) bench/bench_gateway.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
