#!/usr/bin/env bash
# Creates .venv (if missing) and installs the pinned stack of requirements.txt (TensorFlow 2.21 +
# tf-keras).
#
#   tools/install.sh              # CPU TensorFlow 2.21, Horovod 0.28.1 built against it
#   VARIANT=gpu tools/install.sh  # tensorflow[and-cuda] at the same pin, Horovod with NCCL
#   PYTHON=/opt/python3.12/bin/python3 tools/install.sh   # this interpreter, not the first that runs
#   WHEELHOUSE=DIR tools/install.sh   # no network: only the files of DIR (tools/wheelhouse.sh made it);
#                                     # a Horovod wheel DIR carries for this install's key is not compiled again
#
# Without PYTHON, the venv is made with the first of python3.13, python3.12, python3.11, python3.10
# that runs: TensorFlow 2.21 has wheels for those only. Horovod is built from its sdist, edited for this TensorFlow, compiler and CMake by
# tools/horovod_source.py; the wheel is kept in the venv's folder, so a later install with the same
# TensorFlow, Python and edits does not compile again. Idempotent: a stamp file records the hash of
# the requirements and these scripts, so a second call returns at once. Each step says what failed.
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
# A GPU build's Horovod links its CUDA toolkit's runtime (statically) and holds kernels for the
# HOROVOD_BUILD_CUDA_CC_LIST architectures (default: every one its nvcc knows): both name the build.
gpu_build=""
if [[ "$variant" == gpu ]]; then
  cuda_home="${HOROVOD_CUDA_HOME:-${CUDA_HOME:-}}"
  cuda_release="$("$cuda_home/bin/nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\),.*/\1/p' || true)"
  cc_list="${HOROVOD_BUILD_CUDA_CC_LIST:-all}"
  gpu_build="-cuda${cuda_release:-none}-cc${cc_list//,/_}"
fi
want="$(cat "$reqs" "$0" "$root/tools/select_python.sh" "$root/tools/horovod_source.py" | sha256sum | cut -d' ' -f1)-$variant$gpu_build-mpi:$has_mpi"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi

step "$TF_RELEASE (requirements.txt), python: $python ($("$python" --version 2>&1))"

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

# pip_install STEP ARGS...: pip install from PyPI or the wheelhouse (pip_from_source STEP download
# ARGS...: pip download likewise). A package the wheelhouse has no file for is named on one line;
# any other failure shows the end of pip's output.
pip_install() { pip_from_source "$1" install "${@:2}"; }
pip_from_source() {
  local what=$1 verb=$2; shift 2
  if "${pip[@]}" "$verb" "${source_args[@]}" "$@" 2> "$work/pip.err"; then
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
# Horovod's build wants the newest setuptools, which also brings back distutils on Python 3.12+
# (horovodrun imports it).
pip_install "pip upgrade" -q --upgrade pip wheel setuptools

tf_pin="$(grep -E '^tensorflow-cpu==' "$reqs")"
hvd_pin="$(grep -E '^horovod==' "$reqs")"
keras_pin="$(grep -E '^tf-keras==' "$reqs" || true)"
[[ -n "$tf_pin" && -n "$hvd_pin" && -n "$keras_pin" ]] \
  || fail "requirements" "requirements.txt must pin tensorflow-cpu, tf-keras and horovod"
base_reqs="$work/requirements.txt"
grep -vE '^(horovod|tf-keras)==' "$reqs" > "$base_reqs"
if [[ "$variant" == gpu ]]; then
  sed -i "s/^tensorflow-cpu==/tensorflow[and-cuda]==/" "$base_reqs"
fi

step "installing Python packages (TensorFlow ${tf_pin#*==}, $variant)"
pip_install "pip install -r requirements.txt" -q -r "$base_reqs"
# tf-keras requires `tensorflow`, which tensorflow-cpu does not provide: without --no-deps pip
# would install a second, full TensorFlow over the CPU one.
pip_install "pip install $keras_pin" -q --no-deps "$keras_pin"

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

# Horovod's wheel is built once per TensorFlow, Python, set of source edits (the cache key
# tools/horovod_source.py prints), variant (with a GPU build's CUDA release and architectures) and
# MPI setting, and kept in the venv's folder: a later install that changes another pin, or
# re-creates the stack in this venv, installs it again without compiling. The stamp says which of
# the kept wheels is the installed one.
hvd_key_err="$work/horovod-key.err"
hvd_key="$("$venv/bin/python" "$root/tools/horovod_source.py" cache-key 2> "$hvd_key_err")" \
  || fail "horovod edits" "$(tail -n1 "$hvd_key_err")"
hvd_key="$hvd_key-$variant$gpu_build-mpi_$has_mpi"
hvd_cache="$venv/horovod-wheels/$hvd_key"
hvd_stamp="$venv/.horovod-built"
log="$venv/horovod-build.log"
hvd_wheel="$(compgen -G "$hvd_cache/horovod-*.whl" | head -n1 || true)"
# A wheelhouse may carry Horovod wheels built by another install (tools/wheelhouse.sh with
# HOROVOD_WHEELS), each under its key: one with this key fits (the same TensorFlow, Python, edits,
# variant and MPI setting), provided it was built on the same OS release, whose MPI and C++ runtime
# it links; the import check below refuses it otherwise.
carried=""
if [[ -z "$hvd_wheel" && -n "${WHEELHOUSE:-}" ]]; then
  carried="$(compgen -G "$wheelhouse/horovod-wheels/$hvd_key/horovod-*.whl" | head -n1 || true)"
fi
if [[ -f "$hvd_stamp" && "$(cat "$hvd_stamp")" == "$hvd_key" ]] \
    && "$venv/bin/python" -c 'import horovod.tensorflow' 2>/dev/null; then
  step "${hvd_pin} already installed ($hvd_key)"
else
  if [[ -n "$carried" ]]; then
    step "installing ${hvd_pin} from the wheelhouse's wheel for $hvd_key (built elsewhere, not compiled here)"
    mkdir -p "$hvd_cache" && cp "$carried" "$hvd_cache/"
    hvd_wheel="$hvd_cache/${carried##*/}"
  elif [[ -n "$hvd_wheel" ]]; then
    step "installing ${hvd_pin} from the wheel built before: $hvd_wheel"
  else
    step "building ${hvd_pin} from its sdist against TensorFlow, Gloo $mpi_note (about 5 minutes on 2 cores)"
    pip_from_source "horovod sdist" download -q --no-deps --no-binary horovod -d "$work/sdist" "$hvd_pin"
    sdist="$(compgen -G "$work/sdist/horovod-*.tar.gz" | head -n1 || true)"
    [[ -n "$sdist" ]] || fail "horovod sdist" "pip download $hvd_pin brought no horovod-*.tar.gz"
    # One line per edit, in the install's output and at the top of the build log.
    if ! "$venv/bin/python" "$root/tools/horovod_source.py" prepare "$sdist" "$work/src" > "$log" 2> "$work/edit.err"; then
      fail "horovod edits" "$(tail -n1 "$work/edit.err")"
    fi
    cat "$log"
    src="$work/src/horovod-${hvd_pin#*==}"
    rm -rf "$hvd_cache.partial" && mkdir -p "$hvd_cache.partial"
    if ! env "${hvd_env[@]}" MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}" "${pip[@]}" wheel -v --no-build-isolation \
          --no-deps --no-cache-dir -w "$hvd_cache.partial" "$src" >> "$log" 2>&1; then
      tail -n 30 "$log" >&2
      fail "horovod build" "full log in $log"
    fi
    rm -rf "$hvd_cache" && mv "$hvd_cache.partial" "$hvd_cache"
    hvd_wheel="$(compgen -G "$hvd_cache/horovod-*.whl" | head -n1)"
  fi
  pip_install "horovod install" -q --force-reinstall --no-deps "$hvd_wheel"
  # A library built against other headers than the TensorFlow it loads with fails here, at import.
  if ! "$venv/bin/python" -c 'import horovod.tensorflow as hvd; hvd.init(); assert hvd.size() == 1' 2> "$work/check.err"; then
    missing="$(grep -o 'undefined symbol: [^ ]*' "$work/check.err" | head -n1 || true)"
    rm -rf "$hvd_cache"   # not kept: the next install builds again
    fail "horovod check" "horovod.tensorflow does not import${missing:+ ($missing)}: $(tail -n1 "$work/check.err"); build log in $log"
  fi
  if [[ "$variant" == gpu ]]; then
    "$venv/bin/python" -c 'import horovod.tensorflow as hvd; import sys; sys.exit(0 if hvd.nccl_built() else 1)' \
      || fail "horovod check" "Horovod was built without NCCL; full build log in $log"
  fi
  echo "$hvd_key" > "$hvd_stamp"
fi
# tf-keras's requirement of `tensorflow` is met by tensorflow-cpu, which pip check cannot know.
if ! "${pip[@]}" check > "$work/pip-check.txt" 2>&1; then
  broken="$(grep -vE '^tf-keras [^ ]+ requires tensorflow, which is not installed\.$' "$work/pip-check.txt" || true)"
  [[ -z "$broken" ]] || fail "pip check" "$(head -n1 <<< "$broken")"
fi
step "horovod controllers and frameworks:"
TF_CPP_MIN_LOG_LEVEL=3 "$venv/bin/horovodrun" --check-build 2>/dev/null | sed -n '/Available Controllers/,$p'

echo "$want" > "$stamp"
step "done: $venv"
