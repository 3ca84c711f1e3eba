# Two entry points, each doing all set-up itself (idempotent, quick once done):
#   make demo   start a broker, produce, consume, then verify a segment with shmlog dump
#   make test   run the test suite
# The virtual environment lives in .venv; compiled numba kernels are cached in .cache.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export NUMBA_CACHE_DIR ?= $(CURDIR)/.cache/numba

.PHONY: demo test lint bench clean system-packages kernels spark-reader node-clients

# The network-partition tests (tests/cluster) need ip and nft, and root; the Kafka
# listener's tests run kcat (librdkafka's command-line client) and rsyslogd with its
# omkafka module (rsyslog-kafka: a module, so named by the path of its file, a glob),
# and so does the README's rsyslog block. Without them those tests skip, saying why.
# A tool that is missing is installed only when we are root and have apt-get (a
# fresh machine lacks nft, kcat and rsyslog); a failed install is a warning.
SYSTEM_PACKAGES := ip:iproute2 nft:nftables kcat:kcat rsyslogd:rsyslog \
  /usr/lib/*/rsyslog/omkafka.so:rsyslog-kafka

# Each step says what it does first: a first make is minutes of installing and
# compiling, which should not pass in silence.
$(STAMP): setup.cfg pyproject.toml
	@test -x $(BIN)/python || { echo "shmlog: creating the virtual environment in $(VENV)"; \
	  $(PYTHON) -m venv $(VENV); }
	@echo "shmlog: installing shmlog and its dependencies into $(VENV) (numba, pyzmq, PySpark, ...: a minute or more the first time)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,spark]'
	@touch $@
	@echo "shmlog: dependencies installed"

# Every kernel compiled once, in one process, before anything runs (see
# shmlog/devtools/compile_kernels.py); a second or two when numba's cache holds them.
kernels: $(STAMP)
	@$(BIN)/python -m shmlog.devtools.compile_kernels

# The Spark bulk reader's jar, compiled with javac once (shmlog/spark/compile_reader.py);
# without a JDK it says so and the Spark tests use format("shmlog") alone.
spark-reader: $(STAMP)
	@$(BIN)/python -m shmlog.spark.compile_reader

demo: kernels
	$(BIN)/python tools/demo.py demo-data

# The suite mostly waits (for processes, sessions, JVMs): two workers (TEST_WORKERS)
# take each group of tests (tests/conftest.py: a file, or all of tests/cluster or
# tests/spark, which share a cluster and a Spark session) in turn.
TEST_WORKERS ?= 2

# ruff, configured in pyproject.toml: pyflakes, pycodestyle, import order, bugbear.
LINTED := shmlog tests perf tools examples

lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)

test: lint kernels spark-reader system-packages node-clients
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python perf/bench_log.py
	$(BIN)/python perf/bench_appender.py
	$(BIN)/python perf/bench_clients.py
	$(BIN)/python perf/bench_spark.py

system-packages:
	@set -f; for pair in $(SYSTEM_PACKAGES); do \
	  tool=$${pair%%:*}; package=$${pair#*:}; \
	  case $$tool in \
	    /*) (set +f; ls $$tool) >/dev/null 2>&1 && continue;; \
	    *) PATH="$$PATH:/usr/sbin:/sbin" command -v $$tool >/dev/null 2>&1 && continue;; \
	  esac; \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing $$package (for $$tool)"; \
	    { DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$package >/dev/null || \
	      { apt-get update -q >/dev/null && \
	        DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$package >/dev/null; }; } || \
	      echo "warning: could not install $$package: the tests that run $$tool will skip"; \
	  else \
	    echo "note: $$tool is missing (not root, or no apt-get): the tests that run it will skip"; \
	  fi; \
	done

# kafkajs for the Kafka listener's tests (tests/kafka_clients/kafkajs.py), from the
# committed lock file (version pinned) into a git-ignored node_modules; run again only
# when the lock file changes (its copy in node_modules says which was installed).
# Without node and npm the kafkajs tests skip, saying why.
NODE_CLIENTS := tests/kafka_clients/node

node-clients:
	@if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then \
	  echo "note: node or npm is missing (Debian: nodejs, npm): the kafkajs tests will skip"; \
	elif ! cmp -s $(NODE_CLIENTS)/package-lock.json $(NODE_CLIENTS)/node_modules/.installed-lock; then \
	  echo "shmlog: installing kafkajs for the tests (npm ci in $(NODE_CLIENTS))"; \
	  (cd $(NODE_CLIENTS) && npm ci --no-audit --no-fund --loglevel=error >/dev/null && \
	   cp package-lock.json node_modules/.installed-lock) || \
	    echo "warning: npm ci failed in $(NODE_CLIENTS): the kafkajs tests will skip"; \
	fi

clean:
	rm -rf $(VENV) .cache demo-data build *.egg-info $(NODE_CLIENTS)/node_modules
