# dlrover-ray: `make run` trains the quickstart job, `make test` runs the tests.
# Both install into .venv first if needed (scripts/install.sh, pinned CPU wheels).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test bench dashboards-check clean

$(STAMP): pyproject.toml scripts/install.sh
	bash scripts/install.sh

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/dlrover run jobs/quickstart.yaml

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal --durations=25 tests

# Ray head + Prometheus + a short job: every query of dashboards/dlrover.json must return data.
dashboards-check: $(STAMP)
	$(VENV)/bin/dlrover dashboards check

bench: $(STAMP)
	$(VENV)/bin/dlrover bench throughput

clean:
	rm -rf runs data .pytest_cache
