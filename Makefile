# execbox: `make run` starts the service on its embedded defaults; `make test` runs the whole suite.
# Both install what they need first (Python venv, Debian packages via scripts/setup/).

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# Resolve the real interpreter once (the pyenv `python3` on PATH is a slow shim).
PYTHON ?= $(shell python3 -c 'import sys; print(sys.executable)' 2>/dev/null || echo /usr/bin/python3)
HOST ?= 127.0.0.1
PORT ?= 8080

.PHONY: install system-deps-run system-deps-test run test lint fmt bench clean

$(VENV)/.installed: pyproject.toml
	@bash scripts/setup/python.sh "$(PYTHON)" "$(VENV)"
	@touch $@

install: $(VENV)/.installed

system-deps-run:
	@for s in scripts/setup/run/*.sh; do [ -e "$$s" ] || continue; bash "$$s" || exit 1; done

system-deps-test: system-deps-run
	@for s in scripts/setup/test/*.sh; do [ -e "$$s" ] || continue; bash "$$s" || exit 1; done

run: install system-deps-run
	$(VENV)/bin/execbox serve --host $(HOST) --port $(PORT)

test: install system-deps-test
	$(PY) -m ruff check src tests bench
	$(PY) -m pytest -ra $(PYTEST_ARGS)

lint: install
	$(PY) -m ruff check src tests bench

fmt: install
	$(PY) -m ruff check --fix src tests bench

# All bench scripts inside a 15-minute budget, then each issue target beside its figure (misses marked).
# llm-sandbox (the `bench` extra) is the peer in bench/peers/; without it that row says why.
bench: install system-deps-test
	@$(PY) -m pip install -q 'llm-sandbox[docker]>=0.3' || echo "llm-sandbox not installed: the peers table omits it"
	$(PY) bench/run_all.py --budget 840  # + up to 30 s for a stopped bench to shut down: < 15 min

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build dist src/*.egg-info
