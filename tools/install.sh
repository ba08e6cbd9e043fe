#!/usr/bin/env bash
# Creates .venv (if missing) and installs the pinned stack of requirements.txt.
#
#   tools/install.sh              # CPU TensorFlow
#   VARIANT=gpu tools/install.sh  # tensorflow[and-cuda] at the same pin, Horovod with NCCL
#   PYTHON=/opt/python3.11/bin/python3 tools/install.sh   # this interpreter, not the first on PATH
#
# Without PYTHON, the venv is made with the first of python3.11, python3.10, python3.9 on PATH:
# the pins (TensorFlow 2.15.1) have wheels for those only, and newer hosts (Python 3.12, 3.13)
# must be pointed at one. Idempotent: a stamp file records the hash of requirements.txt and this
# script, so a second call returns at once. Each step says what failed.
set -euo pipefail

step() { printf '[install] %s\n' "$*"; }
fail() { printf '[install] FAILED at step "%s": %s\n' "$1" "$2" >&2; exit 1; }

# The interpreter is chosen first, with bash builtins only, so that a host whose PATH holds no
# usable Python gets the one line below and nothing else.
supported=(3.11 3.10 3.9)
if [[ -n "${PYTHON:-}" ]]; then
  python=$PYTHON
else
  python=""
  for v in "${supported[@]}"; do
    if command -v "python$v" >/dev/null 2>&1; then python="python$v"; break; fi
  done
fi
version=""
if [[ -n "$python" ]] && command -v "$python" >/dev/null 2>&1; then
  version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)
fi
if [[ " ${supported[*]} " != *" $version "* ]]; then
  if [[ -n "${PYTHON:-}" ]]; then
    found="PYTHON=$python is ${version:+Python }${version:-not a working Python}"
  else
    others=""
    while read -r name; do
      [[ $name =~ ^python3(\.[0-9]+)?$ && " $others " != *" $name "* ]] || continue
      others+="${others:+, }$name = Python $("$name" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo '?')"
    done < <(compgen -c python3)
    found="no python3.11, python3.10 or python3.9 on PATH (found: ${others:-no python3 at all})"
  fi
  fail "python" "TensorFlow 2.15.1 needs Python 3.9-3.11; $found; ways on: \`uv python install 3.11\` then PYTHON=\$(uv python find 3.11), or \`pyenv install 3.11\` then PYTHON=\$(pyenv prefix 3.11)/bin/python3, or the CPU image (docker build -f docker/Dockerfile.cpu .)"
fi

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

if [[ ! -x "$venv/bin/python" ]]; then
  step "creating $venv"
  "$python" -m venv "$venv" || fail "venv" "python -m venv failed (Debian: apt-get install python3-venv)"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade pip wheel setuptools || fail "pip upgrade" "could not upgrade pip/wheel/setuptools"

tf_pin="$(grep -E '^tensorflow-cpu==' "$reqs")"
hvd_pin="$(grep -E '^horovod==' "$reqs")"
[[ -n "$tf_pin" && -n "$hvd_pin" ]] || fail "requirements" "requirements.txt must pin tensorflow-cpu and horovod"
base_reqs="$(mktemp)"
trap 'rm -f "$base_reqs"' EXIT
grep -vE '^horovod==' "$reqs" > "$base_reqs"
if [[ "$variant" == gpu ]]; then
  sed -i "s/^tensorflow-cpu==/tensorflow[and-cuda]==/" "$base_reqs"
fi

step "installing Python packages (TensorFlow ${tf_pin#*==}, $variant)"
"${pip[@]}" install -q -r "$base_reqs" || fail "pip install -r requirements.txt" "see pip's message above"

hvd_env=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1)
if [[ "$has_mpi" == yes ]]; then
  hvd_env+=(HOROVOD_WITH_MPI=1); mpi_note="with MPI ($(mpirun --version 2>&1 | head -n1))"
else
  hvd_env+=(HOROVOD_WITHOUT_MPI=1); mpi_note="without MPI (no mpicxx found; Debian: apt-get install libopenmpi-dev)"
fi
if [[ "$variant" == gpu ]]; then
  hvd_env+=(HOROVOD_GPU_OPERATIONS=NCCL)
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
  if ! env "${hvd_env[@]}" MAKEFLAGS="-j$(nproc)" "${pip[@]}" install -v --no-build-isolation --no-cache-dir \
        --force-reinstall --no-deps "$hvd_pin" > "$log" 2>&1; then
    tail -n 30 "$log" >&2
    fail "horovod build" "full log in $log"
  fi
  "$venv/bin/python" -c 'import horovod.tensorflow as hvd; hvd.init(); assert hvd.size() == 1' \
    || fail "horovod check" "horovod.tensorflow does not import; full build log in $log"
  echo "$hvd_want" > "$hvd_stamp"
fi
# The build above wants the newest setuptools; TensorBoard 2.15's command line
# (`tensorboard --logdir runs/`) imports pkg_resources, which setuptools 81 dropped.
"${pip[@]}" install -q 'setuptools<81' || fail "setuptools" "could not install setuptools<81 (TensorBoard needs pkg_resources)"
step "horovod controllers and frameworks:"
TF_CPP_MIN_LOG_LEVEL=3 "$venv/bin/horovodrun" --check-build | sed -n '/Available Controllers/,$p'

echo "$want" > "$stamp"
step "done: $venv"
