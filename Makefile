# The two commands of the README: `make run` and `make test`. Both install the
# pinned stack into .venv on first use (tools/install.sh) and reuse it after.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
VARIANT ?= cpu

NP ?= 1
# How NP ranks are started on this machine: one runs alone, more under horovodrun over Gloo (no MPI
# needed), as common/launchers.py builds it. Expanded when a recipe runs, after `install` made $(PY).
LAUNCH = $(if $(filter 1,$(NP)),,$(or $(shell $(PY) -m common.launchers horovodrun $(NP)),$(error cannot build the launch command: $(PY) -m common.launchers horovodrun $(NP) failed)))

.PHONY: lint install wheelhouse result-set weak-scaling preflight test test-all bench clean

# WHEELHOUSE=DIR make install: from the files of DIR only, no network (tools/install.sh).
install:
	@VENV=$(VENV) VARIANT=$(VARIANT) bash tools/install.sh

# Every package `make install` takes from PyPI, for this platform and Python, into wheelhouse/ (or
# WHEELHOUSE=DIR), with SHA256SUMS: for a machine without internet, and for the images.
wheelhouse:
	@WHEELHOUSE=$(or $(WHEELHOUSE),$(CURDIR)/wheelhouse) VARIANT=$(VARIANT) bash tools/wheelhouse.sh

# The CPU image (docker/Dockerfile.cpu, from wheelhouse/: `PYTHON=python3.11 make wheelhouse` first,
# for the image's Python, bookworm's) and its Apptainer image SIF, with SIF.sha256 beside it.
# BASE_IMAGE: where no registry is reachable, a Debian bookworm of your own (docker/Dockerfile.cpu).
# APPTAINER: the host's apptainer (1.3 or newer), else tools/apptainer.sh, which runs Apptainer from a
# Debian unstable root it makes once in APPTAINER_ROOT. docs/sites.md runs both. MKSQUASHFS_ARGS:
# Apptainer's gzip, which every kernel and squashfuse mounts; `-comp zstd -Xcompression-level 3`
# packs 2% larger in a tenth of the time, for kernels from 4.14 that have CONFIG_SQUASHFS_ZSTD.
IMAGE ?= mlperf-hpc-tf:cpu
SIF ?= mlperf-hpc-tf-cpu.sif
MKSQUASHFS_ARGS ?= -comp gzip
BASE_IMAGE ?= python:3.11-slim-bookworm
APPTAINER ?= $(or $(shell command -v apptainer),$(CURDIR)/tools/apptainer.sh)
.PHONY: image sif
image:
	@test -d wheelhouse || { echo "error: wheelhouse/ not found: make it first (PYTHON=python3.11 make wheelhouse)" >&2; exit 1; }
	docker build --build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg GIT_COMMIT=$$(git rev-parse HEAD 2>/dev/null || echo unknown) \
		-f docker/Dockerfile.cpu -t $(IMAGE) .
sif:
	@docker image inspect $(IMAGE) >/dev/null 2>&1 || $(MAKE) image
	$(APPTAINER) build --force --build-arg IMAGE=$(IMAGE) --mksquashfs-args "$(MKSQUASHFS_ARGS)" \
		$(SIF).partial docker/mlperf-hpc-cpu.def
	@mv $(SIF).partial $(SIF) && cd $(dir $(abspath $(SIF))) && sha256sum $(notdir $(SIF)) > $(notdir $(SIF)).sha256 \
		&& echo "[sif] $(SIF): $$(cut -c1-64 $(notdir $(SIF)).sha256)"

# Per benchmark: its data, its config and its run directory (each overridable), and the targets
# data, run, bench-cosmoflow (CosmoFlow) and data-deepcam, run-deepcam, bench-deepcam (DeepCAM).
# DATA_<bench>, CONFIG_<bench> and DATA_TARGET_<bench> are what result-set and weak-scaling use for
# BENCH=<bench>. A new benchmark adds its block here and its name to BENCHMARKS.
BENCHMARKS := cosmoflow deepcam

COSMO_DATA ?= data/cosmoflow_synth32
COSMO_CONFIG ?= cosmoflow/configs/cosmoflow_synthetic_cpu.yaml
RUN_DIR ?= runs/cosmoflow-$(shell date +%Y%m%d-%H%M%S)
DATA_cosmoflow = $(COSMO_DATA)
CONFIG_cosmoflow = $(COSMO_CONFIG)
DATA_TARGET_cosmoflow = data
.PHONY: data run bench-cosmoflow
data: install
	@$(PY) -m cosmoflow.synthetic --output-dir $(COSMO_DATA) --size 32 --n-train 4096 --n-valid 512
run: data
	@$(LAUNCH) $(PY) cosmoflow/train.py $(COSMO_CONFIG) --data-dir $(COSMO_DATA) --output-dir $(RUN_DIR)
bench-cosmoflow: install
	@$(PY) bench/cosmoflow_throughput.py

DEEPCAM_DATA ?= data/deepcam_synth
DEEPCAM_CONFIG ?= deepcam/configs/deepcam_synthetic_cpu.yaml
DEEPCAM_RUN_DIR ?= runs/deepcam-$(shell date +%Y%m%d-%H%M%S)
DATA_deepcam = $(DEEPCAM_DATA)
CONFIG_deepcam = $(DEEPCAM_CONFIG)
DATA_TARGET_deepcam = data-deepcam
.PHONY: data-deepcam run-deepcam bench-deepcam
data-deepcam: install
	@$(PY) -m deepcam.synthetic --output-dir $(DEEPCAM_DATA) --height 128 --width 192 --n-train 512 \
	  --n-valid 64 --cyclone-fraction 0.003
run-deepcam: data-deepcam
	@$(LAUNCH) $(PY) deepcam/train.py $(DEEPCAM_CONFIG) --data_dir_prefix $(DEEPCAM_DATA) \
	  --output_dir $(DEEPCAM_RUN_DIR)
bench-deepcam: install
	@$(PY) bench/deepcam_throughput.py

check_bench = $(if $(filter $(BENCH),$(BENCHMARKS)),,$(error BENCH=$(BENCH) is not a benchmark; known: $(BENCHMARKS)))

# N seeded runs of the synthetic CPU config into one submission-layout folder, then scored:
#   make result-set BENCH=cosmoflow N=10     (or BENCH=deepcam N=5)
BENCH ?= cosmoflow
N ?= 0
RESULT_DIR ?= runs/result-set-$(BENCH)-$(shell date +%Y%m%d-%H%M%S)
result-set: $(DATA_TARGET_$(BENCH))
	$(check_bench)
	@$(PY) -m offline.result_set --bench $(BENCH) --np $(NP) --runs $(N) --output $(RESULT_DIR) \
	  --config $(CONFIG_$(BENCH)) --data-dir $(DATA_$(BENCH))

# M model instances trained at once on this machine (weak scaling), NP ranks each, then scored:
#   make weak-scaling BENCH=deepcam M=2
M ?= 2
WEAK_DIR ?= runs/weak-$(BENCH)-$(shell date +%Y%m%d-%H%M%S)
weak-scaling: $(DATA_TARGET_$(BENCH))
	$(check_bench)
	@$(PY) -m offline.weak_scaling --bench $(BENCH) --instances $(M) --ranks $(NP) --output $(WEAK_DIR) \
	  --config $(CONFIG_$(BENCH)) --data-dir $(DATA_$(BENCH))

# The first thing to run on a new machine (offline/preflight): every rank's device, GPU, CPUs and threads, an
# allreduce sweep, a 20-step benchmark beside its projection. NP ranks, as `make run`; e.g.
#   make preflight NP=2 PREFLIGHT_ARGS="--machine machines/eos-h100.yaml --expect-gpus 8"
PREFLIGHT_ARGS ?=
preflight: install
	@$(LAUNCH) $(PY) -m offline.preflight $(PREFLIGHT_ARGS)

# `make test` skips the tests marked slow (pytest.ini says which); `make test-all` runs them too.
# Both run on TEST_WORKERS pytest processes (pytest-xdist), a test file to one process so that its
# module fixtures (a shared launch, a shared run) run once: most tests wait on a TensorFlow
# subprocess tracing its graphs on one core, so two keep both cores busy. TEST_WORKERS=1: one
# process. .ci/run runs `make test-all TEST_WORKERS=2`, the costliest files first (tests/conftest.py).
TEST_WORKERS ?= 2
XDIST = $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)
test: install
	@$(PY) -m pytest tests -m "not slow" $(XDIST) $(PYTEST_ARGS)

# Lint and format check (ruff, configured in pyproject.toml); `ruff format .` lays the code out.
lint: install
	@$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

test-all: install
	@$(PY) -m pytest tests $(XDIST) $(PYTEST_ARGS)

# Both benchmarks' compute (oneDNN on/off, fp32/bf16) and input figures on this CPU, as one table:
# bench/results/<ISA>.md and .json. `make bench-cosmoflow` / `make bench-deepcam`: one benchmark.
bench: install
	@$(PY) bench/report.py

# Horovod's GPU build (NCCL, this machine's CUDA toolkit) compiled, imported and trained with on the
# CPU, in a venv of its own under GPU_CHECK_DIR (tools/gpu_build_check.sh); not part of `make test`.
.PHONY: gpu-build-check
gpu-build-check:
	@nice -n 15 bash tools/gpu_build_check.sh

clean:
	rm -rf runs data
