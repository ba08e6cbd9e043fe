# shellcheck shell=bash
# Sourced by tools/install.sh and tools/wheelhouse.sh: which Python the pinned stack is installed
# for. Bash builtins only (a host's PATH may hold nothing but a Python that does not fit).
#
# select_python sets `python` to $PYTHON if given, else to the first of python3.11, python3.10,
# python3.9 on PATH, and `python_version` to its X.Y. When none fits it calls fail (defined by the
# caller) with one line: the versions the pins need, what was found, and the ways on.

# TensorFlow 2.15.1 publishes wheels for these only; newest first, the one taken when several exist.
SUPPORTED_PYTHONS=(3.11 3.10 3.9)

select_python() {
  local v name found others=""
  python=""
  if [[ -n "${PYTHON:-}" ]]; then
    python=$PYTHON
  else
    for v in "${SUPPORTED_PYTHONS[@]}"; do
      if command -v "python$v" >/dev/null 2>&1; then python="python$v"; break; fi
    done
  fi
  python_version=""
  if [[ -n "$python" ]] && command -v "$python" >/dev/null 2>&1; then
    python_version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)
  fi
  if [[ " ${SUPPORTED_PYTHONS[*]} " == *" $python_version "* ]]; then
    return 0
  fi
  if [[ -n "${PYTHON:-}" ]]; then
    found="PYTHON=$python is ${python_version:+Python }${python_version:-not a working Python}"
  else
    while read -r name; do
      [[ $name =~ ^python3(\.[0-9]+)?$ && " $others " != *" $name "* ]] || continue
      others+="${others:+, }$name = Python $("$name" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo '?')"
    done < <(compgen -c python3)
    found="no python3.11, python3.10 or python3.9 on PATH (found: ${others:-no python3 at all})"
  fi
  fail "python" "TensorFlow 2.15.1 needs Python 3.9-3.11; $found; ways on: \`uv python install 3.11\` then PYTHON=\$(uv python find 3.11), or \`pyenv install 3.11\` then PYTHON=\$(pyenv prefix 3.11)/bin/python3, or the CPU image (docker build -f docker/Dockerfile.cpu .)"
}
