# k26-ddtree: the two commands on a fresh machine are `make deploy` and `make test`.
# Heavy things are cached outside the repository, keyed by their pins, and reused.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
CACHE ?= $(HOME)/.cache/k26-ddtree
REQ_HASH := $(shell cat requirements/test.txt | sha256sum | cut -c1-12)
VENV := $(CACHE)/venv-test-$(REQ_HASH)
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: help venv test test-unit clean-venv

help:
	@echo "make test        run the CPU test suite (creates the cached venv first)"
	@echo "make test-unit   algorithm unit tests only"
	@echo "make venv        create/refresh the pinned CPU test venv in $(CACHE)"

$(VENV)/.ready: requirements/test.txt
	@echo ">> creating test venv $(VENV)"
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements/test.txt
	touch $@

# The venv is shared by every checkout on this machine, so the project itself is (re)installed
# in editable mode from *this* checkout on every run (a few seconds, no downloads).
venv: $(VENV)/.ready
	$(VENV)/bin/pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v "^WARNING: Location" || true

test-unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test: venv
	$(PY) -m pytest tests $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
