# `make demo` and `make test` do all the set-up on a fresh machine.
SHELL := /bin/bash
ifdef VIRTUAL_ENV
VENV := $(VIRTUAL_ENV)
else
VENV := .venv
endif
PY := $(VENV)/bin/python
SIDCO := $(VENV)/bin/sidco
STAMP := $(VENV)/.sidco-installed
PYTEST_ARGS ?=

.PHONY: install system-deps test screenshots demo bench paper clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo "installing torch 2.13.0 (CPU build) and the testbed into $(VENV) ..."
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $@

system-deps:
	@bash tools/system-deps.sh

test: install system-deps
	$(PY) -m pytest $(PYTEST_ARGS)

screenshots: install system-deps  # refresh docs/screenshots/*.png (make test writes none)
	$(PY) -m pytest -q -p no:randomly tests/dashboard/test_browser.py -k screenshotted --screenshots docs/screenshots

demo: install
	@bash tools/demo.sh "$(SIDCO)"

bench: install
	$(SIDCO) bench --size 26214400 --densities 0.1,0.01,0.001 --run-on cpu

paper: install
	$(SIDCO) paper --store paper.sqlite

clean:
	rm -rf $(VENV) runs demo-out .pytest_cache paper.sqlite
