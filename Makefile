# make demo: the order-processing demo on SQLite.  make test: lint, types and the test suite
# (the docs site's strict build and its samples included).  make docs: the docs site.
VENV   ?= .venv
PYTHON ?= python3
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-dev
BENCH_STAMP = $(VENV)/.installed-bench

.PHONY: demo demo-ts test check lint clean bench chromium packages docs

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The benchmark's peers (DBOS, Celery, procrastinate) and tools, in the same venv.
$(BENCH_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

# make bench: stepwarden (SQLite with its wake-ups and polling only, PostgreSQL) against
# DBOS, Celery and procrastinate
# (bench/README.md). make bench BENCH_ARGS="--quick" for a smoke check.
bench: $(BENCH_STAMP)
	$(PY) -m bench $(BENCH_ARGS)

# make docs: the documentation site (mkdocs.yml, docs/) built into site/. make test builds it
# strictly, offline, and runs every Python sample of the docs (tests/docs/).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# make demo: its shipping agent is served by the TypeScript library's agent runner when
# Node 20+ and npm are here (DEMO_TS=no: by the Python workers, as every other agent).
DEMO_TS ?= $(shell node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' \
	2>/dev/null && command -v npm >/dev/null && echo yes)
demo: $(STAMP)
	$(PY) -m examples.orders.demo $(if $(filter yes,$(DEMO_TS)),--ts-shipping) $(DEMO_ARGS)

# make demo-ts: the demo with the TypeScript shipping agent (Node 20+ and npm needed).
demo-ts: $(STAMP)
	$(PY) -m examples.orders.demo --ts-shipping $(DEMO_ARGS)

# ruff, mypy (strict, over the package, its tests and the example), the package's layers, and
# test modules importing what they share from tests/support only.
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests examples tools
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) tools/test_imports.py

# The dashboard's browser tests drive Debian's Chromium (never a downloaded build).
chromium:
	@command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium)

# What the other tests need from Debian's packages: PgBouncer (the store behind a pooler);
# NATS, Redis and RabbitMQ (the status messages' relay: the tests start instances of their
# own, on their own ports); Prometheus and promtool (a real Prometheus scrapes the metrics,
# and checks the alerting rules of docs/prometheus/). The prometheus package's post-install
# starts its service: a policy-rc.d that exits 101 keeps it from starting (the tests run
# one of their own), removed again unless it was there before.
packages: chromium
	@command -v promtool >/dev/null || ( \
		apt-get update -q && \
		if [ -e /usr/sbin/policy-rc.d ]; then own=; else own=yes; \
			printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; fi; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; \
		status=$$?; if [ -n "$$own" ]; then rm -f /usr/sbin/policy-rc.d; fi; exit $$status)
	@command -v pgbouncer >/dev/null || (apt-get update -q && apt-get install -y -q pgbouncer)
	@command -v nats-server >/dev/null || (apt-get update -q && apt-get install -y -q nats-server)
	@command -v redis-server >/dev/null || (apt-get update -q && apt-get install -y -q redis-server)
	@command -v rabbitmq-server >/dev/null || (apt-get update -q && apt-get install -y -q rabbitmq-server)

# The suite runs in TEST_WORKERS processes (pytest-xdist): the unit and contract tests spread
# one by one, every other module in one of them (its tests may rely on their order; see
# tests/conftest.py); TEST_WORKERS=0 runs it in one. Three on two cores: much of the suite
# waits on the processes, servers and brokers it starts.
TEST_WORKERS ?= 3
test: lint packages
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope $(PYTEST_ARGS)

# make check: the unit and contract tests on SQLite, in process and over HTTP (no server, no
# browser, no broker, no Node), for the loop of a change; make test runs them on PostgreSQL
# and through the TypeScript library too, with everything else. Their tests do not rely on
# one another's order: they are spread one by one, in a random order (the seed is printed;
# PYTEST_ARGS="--random-order-seed=N" runs that order again).
check: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist load --random-order-bucket=global \
		tests/unit tests/contract -k "not postgres and not typescript" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache site
