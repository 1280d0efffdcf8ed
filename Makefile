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
# well; --dist loadfile keeps each module's servers (module fixtures) on one worker
PYTEST_WORKERS ?= 3
# The JupyterLab extension: its sources, and what its build leaves in the Python package.
LABEXT_SOURCES := $(shell find labextension/src labextension/style -type f) \
	labextension/package.json labextension/yarn.lock labextension/tsconfig.json
LABEXT_BUILT := jupyter_gpualloc/labextension/static/style.js
# jlpm and jupyter-builder come with the virtual environment (jupyter_builder)
JLPM := PATH="$(abspath $(VENV))/bin:$$PATH" jlpm

.PHONY: demo test bench venv labextension clean

# The demo's environment: the package itself (its editable install builds labextension/ with
# hatch-jupyter-builder when it is not built yet) and JupyterHub's proxy. No test tools.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	npm install --prefix $(VENV)/node --no-audit --no-fund --loglevel=error configurable-http-proxy@4
	touch $(STAMP)

# The test tools on top, and the built extension linked into the environment, so a rebuild is
# what JupyterLab serves (jupyter-builder comes with the test extras)
$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[$(TEST_EXTRAS)]'
	$(VENV)/bin/jupyter-builder develop --overwrite .
	touch $(TEST_STAMP)

venv: $(TEST_STAMP)

$(LABEXT_BUILT): $(LABEXT_SOURCES) | $(TEST_STAMP)
	cd labextension && $(JLPM) install --immutable && $(JLPM) build:prod

labextension: $(LABEXT_BUILT)

demo: $(STAMP)
	$(VENV)/bin/jupyter-gpualloc demo

test: $(TEST_STAMP) $(LABEXT_BUILT)
	cd labextension && $(JLPM) install --immutable && $(JLPM) test
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile

bench: $(TEST_STAMP)
	$(PY) -m pip install -q -e '.[test,bench]'
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

$(K8S_BIN): k8s/go.mod k8s/go.sum $(wildcard k8s/*.go)
	cd k8s && nice -n 15 go build -buildvcs=false -o $(abspath $(K8S_BIN)) .

k8s-build: $(K8S_BIN)

k8s-up: $(K8S_BIN)
	$(K8S_BIN) up --dir .k8s --fleet $(K8S_FLEET)

k8s-down:
	@if [ -x $(K8S_BIN) ]; then $(K8S_BIN) down --dir .k8s; else echo "no control plane built"; fi
