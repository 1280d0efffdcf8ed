# Set-up and the two commands of the quick start: `make demo` and `make test`.
# Each creates the virtual environment (.venv) and installs what it needs on first use.

VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
STAMP := $(VENV)/.installed
# The JupyterLab extension: its sources, and what its build leaves in the Python package.
LABEXT_SOURCES := $(shell find labextension/src labextension/style -type f) \
	labextension/package.json labextension/yarn.lock labextension/tsconfig.json
LABEXT_BUILT := jupyter_gpualloc/labextension/static/style.js
# jlpm and jupyter-builder come with the virtual environment (jupyter_builder)
JLPM := PATH="$(abspath $(VENV))/bin:$$PATH" jlpm

.PHONY: demo test bench venv labextension clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the editable install builds labextension/ (hatch-jupyter-builder) when it is not built yet
	$(PY) -m pip install -q -e '.[test]'
	# link the built extension into the environment, so a rebuild is what JupyterLab serves
	$(VENV)/bin/jupyter-builder develop --overwrite .
	npm install --prefix $(VENV)/node --no-audit --no-fund --loglevel=error configurable-http-proxy@4
	touch $(STAMP)

venv: $(STAMP)

$(LABEXT_BUILT): $(LABEXT_SOURCES) | $(STAMP)
	cd labextension && $(JLPM) install --immutable && $(JLPM) build:prod

labextension: $(LABEXT_BUILT)

demo: $(STAMP)
	$(VENV)/bin/jupyter-gpualloc demo

test: $(STAMP) $(LABEXT_BUILT)
	cd labextension && $(JLPM) install --immutable && $(JLPM) test
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m pip install -q -e '.[test,bench]'
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis labextension/node_modules labextension/lib jupyter_gpualloc/labextension
