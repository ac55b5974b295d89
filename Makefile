VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv test scripts-test tracking-test survive-test scale-browser-test tutorials demo bench soak binder-check badges clean

# uv installs the same pins as pip in about a third of the time (parallel downloads and unpacking), compiling
# bytecode as pip does; it reads no pip configuration, so pip's find-links (the local CPU torch wheel) are passed
# on (from the environment, else from pip's configuration). Should uv not install, pip does it.
export UV_FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell python3 -m pip config get global.find-links 2>/dev/null))
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt uv \
	    && $(PY) -m uv pip install -q --compile-bytecode --python $(PY) -c constraints.txt -e ".[dev]" \
	    || $(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

# The whole suite in one pytest, in order. The tutorial notebooks are not run here: CI's Binder check runs every one
# of them as Binder installs them (make binder-check); `make tutorials` runs them in this venv, two at a time (each
# a kernel told one CPU).
# LANES=2 runs it in two lanes instead (pytest-xdist workers, a module's tests in one lane; tests/lanes.py: a test
# marked `exclusive` runs with the other lane waiting). Not the default: it was 6-12 % faster on a slower machine and
# 15 % on a faster one (802 s against 945 s), and it fails where a test meets the other lane's load: one run in three
# there (a Tune trial of the Ray Train examples), the one run here (Ctrl-C while a group waits for resources).
LANES ?= 1
test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider --ignore=tests/tracking --ignore=tests/survive --ignore=tests/scale -m "not scripts" $(if $(filter-out 1,$(LANES)),-n $(LANES) --dist loadfile --no-loadscope-reorder) $(PYTEST_ARGS)

# Whole runs (tests marked `scripts`), each in processes or a Ray instance of its own, from start to end: the Ray
# Train example scripts with only their imports changed (examples/ and each framework's), a script under torchrun,
# Tune sweeps (ASHA, Ctrl-C), multi-node clusters (ray.cluster_utils: a lost node, an elastic run), instances with
# token authentication, a fake-GPU instance and one reached through RAY_ADDRESS, the quickstart through `make demo`'s
# runner, a kernel told one CPU and a terminal IPython. Outside `make test` (about 13 minutes on a 2-core machine
# whose single-core reference loop takes 2.4-2.7 s: 40 % of the suite's time there); CI runs it after `make test`.
scripts-test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m scripts tests/integration tests/notebook $(PYTEST_ARGS)

# Experiment tracking's tests (tests/tracking: a real `mlflow server` on 127.0.0.1, W&B offline), outside `make test`
# (the installs and the server are heavy): the [mlflow] and [wandb] extras go into .venv, MLflow's full package (its
# server) into a venv of its own, since it caps pyarrow below the version Ray Data has here. CI runs it after the soak.
MLFLOW_SERVER_VENV ?= .venv-mlflow-server
tracking-test: $(STAMP)
	$(PY) -m uv pip install -q --compile-bytecode --python $(PY) -c constraints.txt -e ".[mlflow,wandb]" \
	    || $(PY) -m pip install -q -c constraints.txt -e ".[mlflow,wandb]"
	test -x $(MLFLOW_SERVER_VENV)/bin/mlflow || { python3 -m venv $(MLFLOW_SERVER_VENV) \
	    && { $(PY) -m uv pip install -q --python $(MLFLOW_SERVER_VENV)/bin/python -c constraints.txt mlflow \
	         || $(MLFLOW_SERVER_VENV)/bin/pip install -q -c constraints.txt mlflow; }; }
	MLFLOW_SERVER_EXE=$(MLFLOW_SERVER_VENV)/bin/mlflow $(PY) -m pytest -q -p no:cacheprovider tests/tracking $(PYTEST_ARGS)

# Groups that outlive their kernel (tests/survive: real kernels restarted, SIGKILLed and contending, each round trip
# starting the shared instance its supervisor runs; two notebooks' groups side by side; a group on a cluster of the
# test's own reached with --address) and JupyterLab's Kernel > Restart in a real browser: outside `make test`; 3.5
# minutes on a quiet 2-core machine before the last two (they add about 1.5), 11 at a load average of 10-24. CI runs
# it after the soak.
survive-test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/survive $(PYTEST_ARGS)

# The dashboard of a 64-rank group (backend none, a twentieth of a CPU each) in JupyterLab and Chromium: the summary,
# a range expanded and collapsed (tests/scale): outside `make test`; 2.5 minutes on a quiet 2-core machine (6.5 loaded), most of it
# the 64 workers starting. CI runs it after survive-test.
scale-browser-test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/scale $(PYTEST_ARGS)

# Sharded (FSDP2) models' tests (tests/sharded: the round trips on one group; in a real kernel, kill + restart, rescale 3 and 2 from buddy
# mirrors; trainers resumed at another world size): outside `make test` (1.5 minutes on a quiet machine, 4-5 loaded). CI runs it after the soak.
sharded-test: $(STAMP)
	RAYTRAIN_NB_SHARDED=1 $(PY) -m pytest -q -p no:cacheprovider tests/sharded $(PYTEST_ARGS)

tutorials: $(STAMP)
	RAYTRAIN_NB_TUTORIALS=1 $(PY) -m pytest -q -p no:cacheprovider tests/notebook/test_tutorials.py $(PYTEST_ARGS)

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
	rm -rf $(VENV) $(MLFLOW_SERVER_VENV) build *.egg-info
