#!/usr/bin/env bash
# Creates .venv (if missing) and installs the pinned stack of requirements.txt.
#
#   tools/install.sh              # CPU TensorFlow
#   VARIANT=gpu tools/install.sh  # tensorflow[and-cuda] at the same pin, Horovod with NCCL
#   PYTHON=/opt/python3.11/bin/python3 tools/install.sh   # this interpreter, not the first on PATH
#   WHEELHOUSE=DIR tools/install.sh   # no network: only the files of DIR (tools/wheelhouse.sh made it)
#
# Without PYTHON, the venv is made with the first of python3.11, python3.10, python3.9 on PATH:
# the pins (TensorFlow 2.15.1) have wheels for those only, and newer hosts (Python 3.12, 3.13)
# must be pointed at one. Idempotent: a stamp file records the hash of requirements.txt and this
# script, so a second call returns at once. Each step says what failed.
set -euo pipefail

step() { printf '[install] %s\n' "$*"; }
fail() { printf '[install] FAILED at step "%s": %s\n' "$1" "$2" >&2; exit 1; }

# The interpreter is chosen first, with bash builtins only, so that a host whose PATH holds no
# usable Python gets one line and nothing else. (${BASH_SOURCE%/*}: dirname may not be on PATH.)
# shellcheck source=tools/select_python.sh
source "${BASH_SOURCE[0]%/*}/select_python.sh"
select_python || exit 1

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$root/.venv}"
variant="${VARIANT:-cpu}"
reqs="$root/requirements.txt"
stamp="$venv/.installed"
# Horovod is rebuilt when OpenMPI appears or goes, so the MPI controller follows the machine.
has_mpi=no
if command -v mpicxx >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then has_mpi=yes; fi
want="$(cat "$reqs" "$0" | sha256sum | cut -d' ' -f1)-$variant-mpi:$has_mpi"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi

step "python: $python ($("$python" --version 2>&1))"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
source_args=()
if [[ -n "${WHEELHOUSE:-}" ]]; then
  wheelhouse="$(realpath -m "$WHEELHOUSE")"
  [[ -f "$wheelhouse/SHA256SUMS" ]] \
    || fail "wheelhouse" "$wheelhouse/SHA256SUMS is missing: not a wheelhouse (make wheelhouse writes one)"
  # Every file the manifest lists, before anything is installed: a copy that lost one names it.
  while read -r _ name; do
    [[ -f "$wheelhouse/$name" ]] || fail "wheelhouse" "$wheelhouse/$name is missing (listed in $wheelhouse/SHA256SUMS)"
  done < "$wheelhouse/SHA256SUMS"
  damaged="$(cd "$wheelhouse" && { sha256sum --quiet -c SHA256SUMS 2>/dev/null || true; } | sed -n 's/: FAILED.*//p' | head -n1)"
  [[ -z "$damaged" ]] || fail "wheelhouse" "$wheelhouse/$damaged does not match its hash in SHA256SUMS (a damaged copy?)"
  made_for="$(sed -n 's/^python \([0-9.]*\).*/\1/p' "$wheelhouse/MADE_FOR" 2>/dev/null || true)"
  made_variant="$(sed -n 's/^variant //p' "$wheelhouse/MADE_FOR" 2>/dev/null || true)"
  [[ "$made_for" == "$python_version" && "$made_variant" == "$variant" ]] || fail "wheelhouse" \
    "$wheelhouse was made for Python ${made_for:-?}, variant ${made_variant:-?}; this install is Python $python_version ($python), variant $variant: make it with PYTHON=$python VARIANT=$variant make wheelhouse"
  step "installing from the wheelhouse $wheelhouse only (no index)"
  # Only the wheelhouse: no index, and none of the find-links, extra indexes or constraints a
  # pip.conf or PIP_* variable of this host adds (they would hide a file the wheelhouse lacks).
  pip=(env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null "${pip[@]}")
  source_args=(--no-index --find-links "$wheelhouse")
fi

# pip_install STEP ARGS...: pip install from PyPI or the wheelhouse. A package the wheelhouse has
# no file for is named on one line; any other failure shows the end of pip's output.
pip_install() {
  local what=$1; shift
  if "${pip[@]}" install "${source_args[@]}" "$@" 2> "$work/pip.err"; then
    return 0
  fi
  local missing
  missing="$(sed -n 's/.*No matching distribution found for \([^ ]*\).*/\1/p' "$work/pip.err" | head -n1)"
  if [[ -n "${WHEELHOUSE:-}" && -n "$missing" ]]; then
    fail "$what" "the wheelhouse $wheelhouse has no file for $missing (make wheelhouse again on a machine with PyPI)"
  fi
  tail -n 30 "$work/pip.err" >&2
  fail "$what" "see pip's message above"
}

if [[ ! -x "$venv/bin/python" ]]; then
  step "creating $venv"
  "$python" -m venv "$venv" || fail "venv" "python -m venv failed (Debian: apt-get install python3-venv)"
fi
pip_install "pip upgrade" -q --upgrade pip wheel setuptools

tf_pin="$(grep -E '^tensorflow-cpu==' "$reqs")"
hvd_pin="$(grep -E '^horovod==' "$reqs")"
[[ -n "$tf_pin" && -n "$hvd_pin" ]] || fail "requirements" "requirements.txt must pin tensorflow-cpu and horovod"
base_reqs="$work/requirements.txt"
grep -vE '^horovod==' "$reqs" > "$base_reqs"
if [[ "$variant" == gpu ]]; then
  sed -i "s/^tensorflow-cpu==/tensorflow[and-cuda]==/" "$base_reqs"
fi

step "installing Python packages (TensorFlow ${tf_pin#*==}, $variant)"
pip_install "pip install -r requirements.txt" -q -r "$base_reqs"

hvd_env=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1)
if [[ "$has_mpi" == yes ]]; then
  hvd_env+=(HOROVOD_WITH_MPI=1); mpi_note="with MPI ($(mpirun --version 2>&1 | head -n1))"
else
  hvd_env+=(HOROVOD_WITHOUT_MPI=1); mpi_note="without MPI (no mpicxx found; Debian: apt-get install libopenmpi-dev)"
fi
if [[ "$variant" == gpu ]]; then
  # Horovod's GPU build compiles CUDA kernels (nvcc) and links NCCL. NCCL comes from the
  # nvidia-nccl-cu12 wheel tensorflow[and-cuda] installs (HOROVOD_NCCL_HOME overrides it), so
  # Horovod runs with the NCCL TensorFlow brought; the CUDA toolkit is CUDA_HOME's: the pinned
  # nvidia-cuda-nvcc-cu12 wheel holds ptxas only (for XLA), no nvcc and no libcudart_static.a.
  nv="$("$venv/bin/python" -c 'import nvidia, os; print(os.path.realpath(list(nvidia.__path__)[0]))' 2>/dev/null)" \
    || fail "cuda" "no nvidia-* wheels in $venv: tensorflow[and-cuda] did not install them"
  cuda_home="${HOROVOD_CUDA_HOME:-${CUDA_HOME:-}}"
  if [[ -z "$cuda_home" ]]; then
    nvcc_wheel="$("$venv/bin/python" -c 'from importlib.metadata import version; print(version("nvidia-cuda-nvcc-cu12"))' 2>/dev/null || echo '?')"
    fail "cuda" "Horovod's NCCL build needs nvcc, which tensorflow[and-cuda]'s wheels do not bring (nvidia-cuda-nvcc-cu12 $nvcc_wheel: ptxas only, in $nv/cuda_nvcc/bin): give CUDA_HOME=a CUDA toolkit with bin/nvcc (e.g. CUDA_HOME=/usr/local/cuda-12.2)"
  fi
  [[ -x "$cuda_home/bin/nvcc" ]] || fail "cuda" "CUDA_HOME=$cuda_home has no bin/nvcc"
  nccl_home="${HOROVOD_NCCL_HOME:-$venv/nccl-from-wheel}"
  nccl_env=()
  if [[ -z "${HOROVOD_NCCL_HOME:-}" ]]; then
    # The wheel ships libnccl.so.2 only; the linker looks for libnccl.so.
    [[ -f "$nv/nccl/include/nccl.h" && -f "$nv/nccl/lib/libnccl.so.2" ]] \
      || fail "cuda" "no nccl.h and libnccl.so.2 in $nv/nccl (the nvidia-nccl-cu12 wheel)"
    rm -rf "$nccl_home" && mkdir -p "$nccl_home/lib"
    ln -s "$nv/nccl/include" "$nccl_home/include"
    ln -s "$nv/nccl/lib/libnccl.so.2" "$nccl_home/lib/libnccl.so.2"
    ln -s libnccl.so.2 "$nccl_home/lib/libnccl.so"
    # Linked as the shared library, found at run time in the wheel (TensorFlow does not load it).
    nccl_env=(HOROVOD_NCCL_LINK=SHARED LDFLAGS="${LDFLAGS:-} -Wl,-rpath,$nv/nccl/lib")
  fi
  step "GPU build: CUDA toolkit $cuda_home ($("$cuda_home/bin/nvcc" --version | tail -n1)), NCCL $nccl_home"
  hvd_env+=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$cuda_home" HOROVOD_NCCL_HOME="$nccl_home"
            "${nccl_env[@]}")
fi
command -v cmake >/dev/null 2>&1 || fail "horovod" "cmake is required to build Horovod (apt-get install cmake)"
command -v g++ >/dev/null 2>&1 || fail "horovod" "a C++ compiler is required to build Horovod (apt-get install g++)"

# Horovod is rebuilt only when what it links against changes (TensorFlow pin,
# variant, MPI present or not), not for every edit of requirements.txt.
hvd_stamp="$venv/.horovod-built"
hvd_want="$hvd_pin $tf_pin $variant mpi:$has_mpi"
if [[ -f "$hvd_stamp" && "$(cat "$hvd_stamp")" == "$hvd_want" ]] \
    && "$venv/bin/python" -c 'import horovod.tensorflow' 2>/dev/null; then
  step "${hvd_pin} already built for this TensorFlow and MPI setting"
else
  step "building ${hvd_pin} from source against TensorFlow, Gloo $mpi_note (about 5 minutes on 2 cores)"
  log="$venv/horovod-build.log"
  if ! env "${hvd_env[@]}" MAKEFLAGS="-j$(nproc)" "${pip[@]}" install "${source_args[@]}" -v --no-build-isolation \
        --no-cache-dir --force-reinstall --no-deps "$hvd_pin" > "$log" 2>&1; then
    tail -n 30 "$log" >&2
    fail "horovod build" "full log in $log"
  fi
  "$venv/bin/python" -c 'import horovod.tensorflow as hvd; hvd.init(); assert hvd.size() == 1' \
    || fail "horovod check" "horovod.tensorflow does not import; full build log in $log"
  if [[ "$variant" == gpu ]]; then
    "$venv/bin/python" -c 'import horovod.tensorflow as hvd; import sys; sys.exit(0 if hvd.nccl_built() else 1)' \
      || fail "horovod check" "Horovod was built without NCCL; full build log in $log"
  fi
  echo "$hvd_want" > "$hvd_stamp"
fi
# The build above wants the newest setuptools; TensorBoard 2.15's command line
# (`tensorboard --logdir runs/`) imports pkg_resources, which setuptools 81 dropped.
pip_install "setuptools<81 (TensorBoard needs pkg_resources)" -q 'setuptools<81'
step "horovod controllers and frameworks:"
TF_CPP_MIN_LOG_LEVEL=3 "$venv/bin/horovodrun" --check-build | sed -n '/Available Controllers/,$p'

echo "$want" > "$stamp"
step "done: $venv"
