# Set-up and the two commands of the quick start: `make demo` and `make test`.
# Each creates the virtual environment (.venv) and installs what it needs on first use.

VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
# The extras `make test` installs; CI adds `frameworks` (JAX's CPU build) for the framework-cap tests
TEST_EXTRAS ?= test
# pytest-xdist workers: most tests wait on real servers, kernels and timers, so three share two cores
# well; --dist loadfile keeps each module's servers (module fixtures) on one worker, and every
# Kubernetes test on one, so one control plane serves them all (tests/conftest.py)
PYTEST_WORKERS ?= 3
# The JupyterLab extension: its sources, and what its build leaves in the Python package.
LABEXT_SOURCES := $(shell find labextension/src labextension/style -type f) \
	labextension/package.json labextension/yarn.lock labextension/tsconfig.json
LABEXT_BUILT := jupyter_gpualloc/labextension/static/style.js
LABEXT_LINK := $(VENV)/share/jupyter/labextensions/jupyter-gpualloc
# jlpm and jupyter-builder come with the virtual environment (jupyter_builder)
JLPM := PATH="$(abspath $(VENV))/bin:$$PATH" jlpm

.PHONY: demo test bench venv labextension clean

# The demo's environment, in steps that say what they do (the times are a fresh clone's first run
# on a two-core machine with a fast connection; see README.md). pip installs the Python packages
# with SKIP_JUPYTER_BUILDER=1: an editable install would otherwise rebuild the JupyterLab
# extension inside pip's build backend, silently and on every `pip install -e` (hatch-jupyter-
# builder's skip-if-exists only applies to non-editable builds); the extension is built by the
# rule below instead, with its output shown. jupyter_builder brings jlpm and jupyter-builder.
$(STAMP): pyproject.toml
	@echo "==> [1/4] Creating the virtual environment $(VENV) (seconds)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@echo "==> [2/4] Installing jupyter-gpualloc and its Python dependencies: JupyterLab, JupyterHub,"
	@echo "    NumPy, ... (about 100 MB of downloads: a minute or two on a fast connection)"
	SKIP_JUPYTER_BUILDER=1 $(PY) -m pip install -e . 'jupyter_builder>=1.3'
	@echo "==> [3/4] Installing JupyterHub's proxy, configurable-http-proxy, from npm (seconds)"
	npm install --prefix $(VENV)/node --no-audit --no-fund --loglevel=error configurable-http-proxy@4
	touch $(STAMP)

# The test tools on top (the extension is built once, by the rule below, not by pip again)
$(TEST_STAMP): $(STAMP)
	SKIP_JUPYTER_BUILDER=1 $(PY) -m pip install -q -e '.[$(TEST_EXTRAS)]'
	touch $(TEST_STAMP)

venv: $(TEST_STAMP) labextension

# The JupyterLab extension, built from labextension/ into jupyter_gpualloc/labextension/ when
# its sources change. The first build fetches its tools into labextension/node_modules.
$(LABEXT_BUILT): $(LABEXT_SOURCES) | $(STAMP)
	@echo "==> [4/4] Building the JupyterLab extension (GPUs panel, status bar): jlpm fetches its build"
	@echo "    tools (about 115 MB of downloads, 450 MB in labextension/node_modules: under a minute on"
	@echo "    a fast connection, the first time only), then compiles it (about 30 s)"
	cd labextension && $(JLPM) install --immutable && $(JLPM) build:prod

# JupyterLab finds the extension through a link in the environment, so a rebuild is what it serves
$(LABEXT_LINK): | $(LABEXT_BUILT)
	$(VENV)/bin/jupyter-builder develop --overwrite .

labextension: $(LABEXT_BUILT) $(LABEXT_LINK)

demo: $(STAMP) labextension
	@echo "==> Starting the demo"
	$(VENV)/bin/jupyter-gpualloc demo

test: $(TEST_STAMP) labextension
	cd labextension && $(JLPM) install --immutable && $(JLPM) test
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile

bench: $(TEST_STAMP)
	SKIP_JUPYTER_BUILDER=1 $(PY) -m pip install -q -e '.[test,bench]'
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis labextension/node_modules labextension/lib jupyter_gpualloc/labextension

# The local Kubernetes control plane for the Kubernetes path (docs/kubernetes.md): one binary built
# from Go modules (k8s/go.mod: kube-apiserver, etcd, kube-scheduler, kube-controller-manager, kwok
# at one release). Go's caches stay in their default places: cold, the build takes tens of minutes;
# warm, seconds. `make k8s-up` starts it with the GPU nodes of K8S_FLEET and returns; the state, the
# logs and the kubeconfig are in .k8s/; `make k8s-down` stops it.
.PHONY: k8s-build k8s-up k8s-down
K8S_BIN := .k8s/bin/controlplane
K8S_FLEET ?= examples/fleets/k8s-demo.yaml

# The version the API server reports (/version, kubectl version): Go modules carry none, so without
# these -X flags (those Kubernetes' own build sets) it says v0.0.0-master; taken from k8s/go.mod
K8S_VERSION := $(shell awk '$$1 == "k8s.io/kubernetes" {print $$2; exit}' k8s/go.mod)
K8S_VERSION_PARTS := $(subst ., ,$(patsubst v%,%,$(K8S_VERSION)))
K8S_VERSION_VAR := k8s.io/component-base/version
K8S_LDFLAGS := -X $(K8S_VERSION_VAR).gitVersion=$(K8S_VERSION) -X $(K8S_VERSION_VAR).gitMajor=$(word 1,$(K8S_VERSION_PARTS)) \
	-X $(K8S_VERSION_VAR).gitMinor=$(word 2,$(K8S_VERSION_PARTS)) -X $(K8S_VERSION_VAR).gitTreeState=clean

$(K8S_BIN): k8s/go.mod k8s/go.sum $(wildcard k8s/*.go)
	cd k8s && nice -n 15 go build -buildvcs=false -ldflags '$(K8S_LDFLAGS)' -o $(abspath $(K8S_BIN)) .

k8s-build: $(K8S_BIN)

k8s-up: $(K8S_BIN)
	$(K8S_BIN) up --dir .k8s --fleet $(K8S_FLEET)

k8s-down:
	@if [ -x $(K8S_BIN) ]; then $(K8S_BIN) down --dir .k8s; else echo "no control plane built"; fi
