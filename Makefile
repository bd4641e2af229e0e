# Two commands do all set-up on a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PLUGINS := $(wildcard plugins/ctxkernel-*)
EXAMPLES := $(wildcard examples/ctxkernel-*)
STAMP := $(VENV)/.installed

# Python's default: cache compiled modules (and pytest's rewritten test modules) in __pycache__.
# A machine that sets PYTHONDONTWRITEBYTECODE makes each of the suite's hundreds of Python
# processes compile the kernel again; in the test collection alone that doubled the CPU time.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-fast lint bench stress install clean

$(STAMP): pyproject.toml $(wildcard plugins/*/pyproject.toml) $(wildcard examples/*/pyproject.toml) requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt -e '.[deepseek,serve,ui,langchain,pydantic-ai,openai-agents]' $(foreach p,$(PLUGINS) $(EXAMPLES),-e $(p))
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ctxkernel simulate --workload coding-long --profile none,all
	@echo
	@echo "Next, the same session under pressure (half its unmanaged peak), with a chart:"
	@echo "  $(VENV)/bin/ctxkernel simulate --workload coding-long --profile none,all --window 0.5x --report demo.html"
	@echo "and your own recorded session (Claude Code, Codex, OpenAI chat, SWE-agent, OpenHands):"
	@echo "  $(VENV)/bin/ctxkernel simulate --transcript PATH --profile none,all --window 0.5x"

# `make lint` checks formatting too (ruff format --check); LINT_FORMAT=0 skips that part
LINT_FORMAT ?= 1

lint: $(STAMP)
	CTXKERNEL_LINT_FORMAT=$(LINT_FORMAT) bash scripts/lint.sh $(PY)

# the tests run in parallel, one worker per core (pytest-xdist); the tests of a file stay on one
# worker, so its module fixtures are built once (conftest.py hands out slow files first).
# PYTEST_PARALLEL= runs them in one process.
PYTEST_PARALLEL ?= -n auto --dist loadfile

# everything: the static checks, then every test tier (slow ones included)
test: lint
	bash scripts/test-services.sh $(PY) -m pytest $(PYTEST_PARALLEL)

# the quick tier while working: no static checks, no tests marked slow
test-fast: $(STAMP)
	bash scripts/test-services.sh $(PY) -m pytest $(PYTEST_PARALLEL) -m "not slow"

# the peers serve is measured against (LiteLLM's proxy, pinned) go into their own venvs under
# .cache/bench-peers, never into $(VENV); where one cannot be installed its rows say why and skip
bench: $(STAMP)
	$(PY) -m pip install -q -r benchmarks/requirements.txt
	$(PY) benchmarks/_peers.py install
	$(PY) benchmarks/run.py --out benchmarks/results/latest.jsonl
	$(PY) benchmarks/tables.py benchmarks/results/latest.jsonl > benchmarks/results/latest.md

# crash proof at scale: 100+ SIGKILL trials per store backend (PostgreSQL from test-services.sh),
# then the fleet proof: 4 workers, 40 sessions, a worker SIGKILLed 24 times
stress: $(STAMP)
	bash scripts/test-services.sh $(PY) benchmarks/stress_store.py --trials 100
	bash scripts/test-services.sh $(PY) benchmarks/stress_fleet.py

clean:
	rm -rf $(VENV)
