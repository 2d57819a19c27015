# gpushare: `make demo` and `make test` are the whole set-up (see README).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint typecheck unit bench bench-kube bench-trace bench-log generate check-generated clean venv chaos deploy-check k8s-bin test-k8s shapes

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpushare demo

# The real-Kubernetes tier (tests/k8s) runs whenever its binaries are there and skips
# otherwise; GPUSHARE_REQUIRE_K8S=1 (CI) turns that skip into a failure.
# loadfile: one worker runs a module, so a tier module's control plane starts once.
test: $(STAMP) lint
	$(BIN)/python -m pytest -n 2 --dist loadfile tests

# Builds (Go 1.26, the module proxy; once, cached in $GPUSHARE_K8S_BIN_DIR, default
# ~/.cache/gpushare/k8s) or finds kube-apiserver, kube-scheduler, kube-controller-manager and
# kubelet, and installs Debian's etcd-server, containerd, runc and busybox-static if missing.
k8s-bin:
	bash src/gpushare/embedded/k8s/install.sh --kubelet --build

# Only the real-Kubernetes tier; missing binaries fail rather than skip.
test-k8s: $(STAMP)
	GPUSHARE_REQUIRE_K8S=1 $(BIN)/python -m pytest -n 2 --dist loadfile -m k8s tests/k8s

# Generated pod shapes (tests/k8s/test_pod_shapes.py) through the real kube-scheduler, on
# the real kubelet and the test kubelet: a long run of EXAMPLES batches from SEED. A failure
# prints the batch and Hypothesis' @reproduce_failure line. CI runs a few from seed 36.
SEED ?= 36
EXAMPLES ?= 40
shapes: $(STAMP)
	GPUSHARE_REQUIRE_K8S=1 GPUSHARE_SHAPES_SEED=$(SEED) GPUSHARE_SHAPES_EXAMPLES=$(EXAMPLES) \
		$(BIN)/python -m pytest -p no:xdist -s -m k8s tests/k8s/test_pod_shapes.py

lint: $(STAMP) typecheck
	$(BIN)/ruff check src tests benchmarks tools
	$(BIN)/ruff format --check src tests benchmarks tools
	$(BIN)/lint-imports
	$(BIN)/vulture src/gpushare tools/vulture_allowlist.py --exclude src/gpushare/kubelet_api --min-confidence 60

# The package is src/gpushare (src layout): mypy reads it from mypy_path = "src".
typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest -m "unit and not slow" tests/unit

# Renders every deploy/ overlay with kubectl kustomize and validates it (tests/deploy).
deploy-check: $(STAMP)
	$(BIN)/python -m pytest -p no:xdist -q tests/deploy

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run
	$(BIN)/python -m benchmarks.device_ids

bench-trace: $(STAMP)
	$(BIN)/gpushare bench trace --family all --policy fragmentation,fgd --seeds 42-51

# The real kube-scheduler with and without the extender (needs `make k8s-bin`; says so
# and exits 0 without it).
bench-kube: $(STAMP)
	$(BIN)/python -m benchmarks.kube_scheduler

bench-log: $(STAMP)
	$(BIN)/python -m benchmarks.log_replay

chaos: $(STAMP)
	$(BIN)/python -m tools.chaos --duration 60

generate: $(STAMP)
	$(BIN)/python -m tools.generate

check-generated: $(STAMP)
	$(BIN)/python -m tools.generate --check

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
