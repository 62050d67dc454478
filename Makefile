# flexgate: `make demo`, `make test`, `make bench`, `make lint`, `make compose-lab`. Each creates
# .venv when missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench reliability soak compose-lab base-images clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "flexgate needs Python 3.11 or newer: set PYTHON=/path/to/python3.11")'
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all,test]'
	@touch $@

demo: $(STAMP)
	$(BIN)/flexgate lab
	$(BIN)/flexgate allocate examples/site.json --reduction-kw 25
	$(BIN)/flexgate allocate examples/site.json --reduction-kw 25 --strategy equal
	$(BIN)/flexgate quote examples/site.json --reduction-kw 25 --window-s 3600
	$(BIN)/flexgate pfi examples/sweep.csv
	@mkdir -p out
	$(BIN)/flexgate simulate --workloads 200 --plot out/simulate.png
	$(BIN)/flexgate sync check --delay-s 1.2 --job-mix examples/site.json
	$(BIN)/flexgate sync simulate --jobs 50 --period-s 2 --duty 0.5 --delay-s 1.5 --gain-per-s 0.3 --duration-s 300 --plot out/sync.png

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The suite on TEST_WORKERS pytest-xdist workers: its tests mostly wait on servers, agents and
# labs, so more workers than cores pay. Tests sharing a server run on one worker, one after
# another (XDIST_GROUPS in tests/conftest.py; README.md). TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 3
test: lint
	$(BIN)/pytest -n $(TEST_WORKERS) --durations=40  # the slowest tests, for whoever makes the suite faster

reliability: $(STAMP)  # the fault, bad-input and security tests of docs/reliability.md
	FLEXGATE_RECOVERY_REPORT=bench/results/reliability.json $(BIN)/pytest tests/agents/test_crash.py tests/agents/test_caps.py tests/agents/test_nvml.py \
	    tests/agents/test_service.py tests/gateway/test_restart.py tests/gateway/test_events.py \
	    tests/gateway/test_ven.py tests/gateway/test_ven_security.py tests/gateway/test_security.py \
	    tests/gateway/test_api.py tests/gateway/test_store.py tests/gateway/test_signals.py \
	    tests/test_cli_fuzz.py tests/test_lab.py tests/gateway/test_agent_down.py \
	    tests/gateway/test_planner.py tests/test_clock_step.py tests/test_openapi_fuzz.py \
	    tests/test_soak.py tests/test_bind.py tests/gateway/test_ven31.py \
	    tests/gateway/test_ven31_security.py tests/gateway/test_signals31.py

soak: $(STAMP)  # 60 s, 50 clients, 1000 nodes: bench/results/soak.json
	$(BIN)/python bench/soak.py

bench: $(STAMP)
	$(BIN)/python bench/allocate_bench.py
	$(BIN)/python bench/simulate_bench.py
	$(BIN)/python bench/sync_bench.py
	$(BIN)/python bench/agent_bench.py
	$(BIN)/python bench/gateway_bench.py
	$(BIN)/python bench/ven_bench.py
	$(BIN)/python bench/closed_loop_bench.py
	$(BIN)/python bench/campaign_bench.py --jobs 2  # about 15 min: both loops in docs/benchmarks.md
	$(BIN)/python bench/pfi_bench.py
	$(BIN)/python bench/meter_history_bench.py
	$(BIN)/python bench/nats_bench.py  # needs nats-server (scripts/ci-nats-prometheus.sh)
	$(BIN)/python bench/fast_bench.py  # needs nats-server: the fast path's triggers

# The lab in containers (docs/operations.md): needs a Docker engine and docker-compose.
# COMPOSE_LAB_ARGS=--postgres puts the gateway on PostgreSQL; --keep leaves the stack up.
compose-lab: $(STAMP)
	$(BIN)/python -m flexgate.lab.compose $(COMPOSE_LAB_ARGS)

base-images:  # python:3.11-slim and debian:bookworm-slim made offline (root, debootstrap)
	scripts/local-base-image.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
