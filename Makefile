VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv test demo bench soak binder-check badges clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

# The tutorial notebooks (tests/notebook/test_tutorials.py) run in a pytest of their own beside the rest: each
# starts its own kernel and Ray instance told it has one CPU, so they overlap the suite's waits on its own Ray.
# Their report (artifacts/tutorials.log, artifacts/junit-tutorials.xml) follows the suite's; either failing fails
# `make test`. TUTORIALS=0 leaves them out (e.g. with PYTEST_ARGS="-k ...").
TUTORIALS ?= 1
test: $(STAMP)
	@mkdir -p artifacts
	@if [ "$(TUTORIALS)" = 1 ]; then \
	    $(PY) -m pytest -q -p no:cacheprovider tests/notebook/test_tutorials.py \
	        --junitxml=artifacts/junit-tutorials.xml > artifacts/tutorials.log 2>&1 & \
	fi; \
	$(PY) -m pytest -q -p no:cacheprovider --ignore=tests/notebook/test_tutorials.py $(PYTEST_ARGS); main=$$?; \
	tutorials=0; if [ "$(TUTORIALS)" = 1 ]; then wait $$!; tutorials=$$?; \
	    echo "--- the tutorial notebooks (tests/notebook/test_tutorials.py):"; cat artifacts/tutorials.log; fi; \
	exit $$(( main || tutorials ))

demo: $(STAMP)
	$(PY) -m raytrain_nb.demo notebooks/01_quickstart.ipynb

bench: $(STAMP)
	$(PY) bench/run_all.py

# Chaos soak (soak/): `make soak DURATION=120 SEED=7`; without SEED a random one is drawn and printed.
# SOAK_ARGS passes more flags, e.g. SOAK_ARGS="--workers 3 --kernel-share 0.5 --weights kill_rescale=0".
DURATION ?= 120
SEED ?=
SOAK_ARGS ?=
soak: $(STAMP)
	$(PY) -m soak.chaos --duration $(DURATION) $(if $(SEED),--seed $(SEED)) $(SOAK_ARGS)

# Binder's install checked as repo2docker does it, every notebook run under the pod's limits (.ci/binder-check).
binder-check: $(STAMP)
	bash .ci/binder-check

# The README's Binder badges, from [tool.raytrain_nb] binder-repository in pyproject.toml.
badges:
	python3 tools/badges.py

clean:
	rm -rf $(VENV) build *.egg-info
