# shellcheck shell=bash
# Sourced by tools/install.sh and tools/wheelhouse.sh: which Python the stack is installed for.
# Bash builtins only (a host's PATH may hold nothing but a Python that does not fit).
#
# select_python sets `python` to $PYTHON if given, else to the first of SUPPORTED_PYTHONS that runs,
# and `python_version` to its X.Y. When it does not fit it calls fail (defined by the caller) with
# one line: what was asked, what was found, the ways on.

# TensorFlow 2.21 publishes wheels for Python 3.10-3.13 (newest first); tf-keras gives it the Keras 2
# the code is.
TF_RELEASE="TensorFlow 2.21.0"
SUPPORTED_PYTHONS=(3.13 3.12 3.11 3.10)

# python_version_of NAME: X.Y of the interpreter NAME by running it; nothing if it does not run.
# (A pyenv shim answers `command -v python3.12` for a version that is not active, then fails.)
python_version_of() {
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

select_python() {
  local v name found others="" names="" oldest newest
  python=""
  python_version=""
  if [[ -n "${PYTHON:-}" ]]; then
    python=$PYTHON
    if command -v "$python" >/dev/null 2>&1; then python_version=$(python_version_of "$python"); fi
  else
    for v in "${SUPPORTED_PYTHONS[@]}"; do
      if command -v "python$v" >/dev/null 2>&1 && [[ "$(python_version_of "python$v")" == "$v" ]]; then
        python="python$v"; python_version=$v; break
      fi
    done
  fi
  if [[ -n "$python_version" && " ${SUPPORTED_PYTHONS[*]} " == *" $python_version "* ]]; then
    return 0
  fi
  newest=${SUPPORTED_PYTHONS[0]}
  oldest=${SUPPORTED_PYTHONS[${#SUPPORTED_PYTHONS[@]}-1]}
  if [[ -n "${PYTHON:-}" ]]; then
    found="PYTHON=$python is ${python_version:+Python }${python_version:-not a working Python}"
  else
    while read -r name; do
      [[ $name =~ ^python3(\.[0-9]+)?$ && " $others " != *" $name "* ]] || continue
      v=$(python_version_of "$name")
      others+="${others:+, }$name = ${v:+Python }${v:-does not run}"
    done < <(compgen -c python3)
    for v in "${SUPPORTED_PYTHONS[@]}"; do names+="${names:+, }python$v"; done
    found="none of $names runs on PATH (found: ${others:-no python3 at all})"
  fi
  fail "python" "$TF_RELEASE needs Python $oldest-$newest; $found; ways on: \`uv python install $newest\` then PYTHON=\$(uv python find $newest), or \`pyenv install $newest\` then PYTHON=\$(pyenv prefix $newest)/bin/python3, or the CPU image (docker build -f docker/Dockerfile.cpu .)"
}
