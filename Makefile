# Two entry points, each doing all set-up itself (idempotent, quick once done):
#   make demo   start a broker, produce, consume, then verify a segment with shmlog dump
#   make test   run the test suite
# The virtual environment lives in .venv; compiled numba kernels are cached in .cache.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export NUMBA_CACHE_DIR ?= $(CURDIR)/.cache/numba

.PHONY: demo test bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,spark]'
	touch $@

demo: $(STAMP)
	$(BIN)/python tools/demo.py demo-data

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python perf/bench_log.py
	$(BIN)/python perf/bench_appender.py
	$(BIN)/python perf/bench_clients.py
	$(BIN)/python perf/bench_spark.py

clean:
	rm -rf $(VENV) .cache demo-data build *.egg-info
