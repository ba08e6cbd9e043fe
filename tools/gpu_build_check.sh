#!/usr/bin/env bash
# Horovod's GPU build, compiled, linked and imported on a machine without a GPU: tools/install.sh
# with VARIANT=gpu (the tensorflow[and-cuda] wheels, NCCL from nvidia-nccl-cu12, Horovod 0.28.1
# built from its sdist with HOROVOD_GPU_OPERATIONS=NCCL and the edits of tools/horovod_source.py)
# into a venv of its own, then `import horovod.tensorflow` with every symbol bound at load,
# hvd.nccl_built(), and a one-epoch CosmoFlow run on the CPU (TensorFlow's GPU wheel falls back to
# it). Run it after every change to tools/horovod_source.py; docs/sites.md has its last result.
#
#   make gpu-build-check                       # CUDA toolkit: HOROVOD_CUDA_HOME, CUDA_HOME or /usr/local/cuda
#   GPU_CHECK_DIR=DIR GPU_CHECK_JOBS=2 tools/gpu_build_check.sh
#
# GPU_CHECK_DIR (default /var/tmp/mlperf-hpc-gpu-build-check) holds the venv, the data and the
# run; a second call with the same requirements, scripts, edits, CUDA release and architectures
# reuses the built wheel. GPU_CHECK_JOBS: make's job count (default: every core).
# HOROVOD_BUILD_CUDA_CC_LIST (Horovod's own variable) defaults to 80,90 here (A100, H100): the
# check is of the build, not of kernels for every GPU. The last line is the verdict with the time.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${GPU_CHECK_DIR:-/var/tmp/mlperf-hpc-gpu-build-check}"
cuda_home="${HOROVOD_CUDA_HOME:-${CUDA_HOME:-/usr/local/cuda}}"
if [[ ! -x "$cuda_home/bin/nvcc" ]]; then
  echo "error: no CUDA toolkit at $cuda_home (no bin/nvcc): give HOROVOD_CUDA_HOME=a CUDA toolkit" >&2
  exit 2
fi

start=$SECONDS
jobs="${GPU_CHECK_JOBS:-$(nproc)}"
venv="$dir/venv"
log="$dir/gpu-build-check.log"
mkdir -p "$dir"
say() { printf '[gpu-build-check] %s\n' "$*"; }
verdict() {
  local took=$((SECONDS - start))
  say "$1 in $((took / 60))m$(printf '%02d' $((took % 60)))s: $2"
}

export HOROVOD_CUDA_HOME="$cuda_home" HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-80,90}"
nvcc="$("$cuda_home/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
say "CUDA $nvcc ($cuda_home), archs $HOROVOD_BUILD_CUDA_CC_LIST, $(c++ --version | head -n1), make -j$jobs; log: $log"

# make's own MAKEFLAGS (a jobserver) does not reach through pip and CMake: the job count is ours.
if ! VENV="$venv" VARIANT=gpu MAKEFLAGS="-j$jobs" bash "$root/tools/install.sh" 2>&1 | tee "$log"; then
  failed="$(sed -n 's/^\[install\] FAILED at //p' "$log" | tail -n1)"
  if [[ "$failed" == 'step "horovod build"'* ]]; then
    # The compiler's own line (nvcc, g++ or the linker), not pip's summary of it.
    why="$(grep -m1 -E '(error|fatal) *:|CMake Error|undefined reference' "$venv/horovod-build.log" || true)"
    verdict FAIL "Horovod's GPU build: ${why:-see $venv/horovod-build.log}"
  else
    verdict FAIL "tools/install.sh failed at ${failed:-an unnamed step: $(tail -n1 "$log")}"
  fi
  exit 1
fi
py="$venv/bin/python"

# LD_BIND_NOW: every symbol of Horovod's libraries is bound when they load, not at its first call.
if ! import="$(CUDA_VISIBLE_DEVICES="" LD_BIND_NOW=1 TF_CPP_MIN_LOG_LEVEL=3 "$py" -c '
import horovod.tensorflow as hvd
assert hvd.nccl_built(), "hvd.nccl_built() is false"
hvd.init()
print(f"nccl_built {hvd.nccl_built()}, gloo {hvd.gloo_built()}, mpi {hvd.mpi_built()}, size {hvd.size()}")
' 2>&1)"; then
  verdict FAIL "import horovod.tensorflow: $(grep -m1 -o 'undefined symbol: [^ ,]*' <<< "$import" || tail -n1 <<< "$import")"
  exit 1
fi
say "import horovod.tensorflow: $(tail -n1 <<< "$import")"
lib="$(compgen -G "$venv/lib/python*/site-packages/horovod/tensorflow/mpi_lib*.so" | head -n1)"
say "$lib links: $(ldd "$lib" | grep -oE '(libnccl|libcudart)[^ ]* => [^ ]*' | tr '\n' ' ')"

data="$dir/cosmoflow_synth32"
[[ -d "$data/train" ]] || (cd "$root" && "$py" -m cosmoflow.synthetic --output-dir "$data" --size 32 \
  --n-train 64 --n-valid 16 > "$dir/synthetic.log" 2>&1) \
  || { verdict FAIL "synthetic data: $(tail -n1 "$dir/synthetic.log")"; exit 1; }
rm -rf "$dir/run"
# Exit 0 (target reached) or 3 (not in one epoch) both mean it trained; the MLPerf log of a run
# stopped short of its target is not checked.
rc=0
CUDA_VISIBLE_DEVICES="" "$py" "$root/cosmoflow/train.py" "$root/tests/configs/cosmoflow_tiny.yaml" \
  --data-dir "$data" --output-dir "$dir/run" --n-train 64 --n-valid 16 --n-epochs 1 \
  --set runtime.check_log=false > "$dir/train.log" 2>&1 || rc=$?
if [[ $rc -ne 0 && $rc -ne 3 ]]; then
  verdict FAIL "one-epoch CosmoFlow run exited $rc: $(grep -m1 '^error:' "$dir/train.log" || tail -n1 "$dir/train.log")"
  exit 1
fi
built="not compiled in this run: its wheel was kept in $venv/horovod-wheels"
if grep -q '^\[install\] building horovod' "$log"; then built="compiled in this run"; fi
verdict PASS "Horovod 0.28.1's GPU build (NCCL, CUDA $nvcc, archs $HOROVOD_BUILD_CUDA_CC_LIST; $built) imports with every symbol bound, nccl_built, and a one-epoch CosmoFlow run on the CPU trained (exit $rc; $dir/train.log)"
