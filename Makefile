# The two commands of the README: `make run` and `make test`. Both install the
# pinned stack into .venv on first use (tools/install.sh) and reuse it after.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
VARIANT ?= cpu

COSMO_DATA ?= data/cosmoflow_synth32
COSMO_CONFIG ?= cosmoflow/configs/cosmoflow_synthetic_cpu.yaml
RUN_DIR ?= runs/cosmoflow-$(shell date +%Y%m%d-%H%M%S)
DEEPCAM_DATA ?= data/deepcam_synth
DEEPCAM_CONFIG ?= deepcam/configs/deepcam_synthetic_cpu.yaml
DEEPCAM_RUN_DIR ?= runs/deepcam-$(shell date +%Y%m%d-%H%M%S)
NP ?= 1
# How NP ranks are started on this machine (Gloo needs no MPI).
LAUNCH = $(if $(filter 1,$(NP)),,$(VENV)/bin/horovodrun -np $(NP) -H localhost:$(NP) --gloo)

.PHONY: install run data run-deepcam data-deepcam result-set weak-scaling test test-all bench bench-deepcam \
	bench-budgets clean

install:
	@VENV=$(VENV) VARIANT=$(VARIANT) bash tools/install.sh

data: install
	@$(PY) -m cosmoflow.synthetic --output-dir $(COSMO_DATA) --size 32 --n-train 4096 --n-valid 512

run: data
	@$(LAUNCH) $(PY) cosmoflow/train.py $(COSMO_CONFIG) --data-dir $(COSMO_DATA) --output-dir $(RUN_DIR)

data-deepcam: install
	@$(PY) -m deepcam.synthetic --output-dir $(DEEPCAM_DATA) --height 128 --width 192 \
	  --n-train 512 --n-valid 64 --cyclone-fraction 0.003

run-deepcam: data-deepcam
	@$(LAUNCH) $(PY) deepcam/train.py $(DEEPCAM_CONFIG) --data_dir_prefix $(DEEPCAM_DATA) \
	  --output_dir $(DEEPCAM_RUN_DIR)

# N seeded runs of the synthetic CPU config into one submission-layout folder, then scored:
#   make result-set BENCH=cosmoflow N=10     (or BENCH=deepcam N=5)
BENCH ?= cosmoflow
N ?= 0
RESULT_DIR ?= runs/result-set-$(BENCH)-$(shell date +%Y%m%d-%H%M%S)
result-set: $(if $(filter deepcam,$(BENCH)),data-deepcam,data)
	@$(PY) -m common.result_set --bench $(BENCH) --np $(NP) --runs $(N) --output $(RESULT_DIR) \
	  --config $(if $(filter deepcam,$(BENCH)),$(DEEPCAM_CONFIG),$(COSMO_CONFIG)) \
	  --data-dir $(if $(filter deepcam,$(BENCH)),$(DEEPCAM_DATA),$(COSMO_DATA))

# M model instances trained at once on this machine (weak scaling), NP ranks each, then scored:
#   make weak-scaling BENCH=deepcam M=2
M ?= 2
WEAK_DIR ?= runs/weak-$(BENCH)-$(shell date +%Y%m%d-%H%M%S)
weak-scaling: $(if $(filter deepcam,$(BENCH)),data-deepcam,data)
	@$(PY) -m common.weak_scaling --bench $(BENCH) --instances $(M) --ranks $(NP) --output $(WEAK_DIR) \
	  --config $(if $(filter deepcam,$(BENCH)),$(DEEPCAM_CONFIG),$(COSMO_CONFIG)) \
	  --data-dir $(if $(filter deepcam,$(BENCH)),$(DEEPCAM_DATA),$(COSMO_DATA))

# `make test` skips the tests marked slow (pytest.ini says which); `make test-all` runs them too.
test: install
	@$(PY) -m pytest tests -m "not slow" $(PYTEST_ARGS)

test-all: install
	@$(PY) -m pytest tests $(PYTEST_ARGS)

bench: install
	@$(PY) bench/cosmoflow_throughput.py

bench-deepcam: install
	@$(PY) bench/deepcam_throughput.py

# `make run` training and `make test` wall time against their budgets on this CPU.
bench-budgets: install
	@$(PY) bench/time_budgets.py

clean:
	rm -rf runs data
