# The two commands of the README: `make run` and `make test`. Both install the
# pinned stack into .venv on first use (tools/install.sh) and reuse it after.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
VARIANT ?= cpu

COSMO_DATA ?= data/cosmoflow_synth32
COSMO_CONFIG ?= cosmoflow/configs/cosmoflow_synthetic_cpu.yaml
RUN_DIR ?= runs/cosmoflow-$(shell date +%Y%m%d-%H%M%S)
NP ?= 1

.PHONY: install run data test bench clean

install:
	@VENV=$(VENV) VARIANT=$(VARIANT) bash tools/install.sh

data: install
	@$(PY) -m cosmoflow.synthetic --output-dir $(COSMO_DATA) --size 32 --n-train 4096 --n-valid 512

run: data
	@if [ "$(NP)" = 1 ]; then \
	  $(PY) cosmoflow/train.py $(COSMO_CONFIG) --data-dir $(COSMO_DATA) --output-dir $(RUN_DIR); \
	else \
	  $(VENV)/bin/horovodrun -np $(NP) -H localhost:$(NP) --gloo \
	    $(PY) cosmoflow/train.py $(COSMO_CONFIG) --data-dir $(COSMO_DATA) --output-dir $(RUN_DIR); \
	fi

test: install
	@$(PY) -m pytest tests $(PYTEST_ARGS)

bench: install
	@$(PY) bench/cosmoflow_throughput.py

clean:
	rm -rf runs data
