#!/usr/bin/env bash
# Downloads everything tools/install.sh installs, for this platform and Python, into a wheelhouse
# that a machine without internet installs from (WHEELHOUSE=DIR make install, and the images).
#
#   make wheelhouse                                 # wheelhouse/ (CPU), on a machine with PyPI
#   WHEELHOUSE=/shared/wh VARIANT=gpu make wheelhouse   # tensorflow[and-cuda] and its CUDA wheels
#   HOROVOD_WHEELS=.venv/horovod-wheels make wheelhouse # with the Horovod wheels .venv's install built
#
# DIR holds the pinned packages of requirements.txt with their dependencies as wheels, Horovod's
# sdist (built on the target, against its TensorFlow and MPI), with HOROVOD_WHEELS the wheels an
# install kept (DIR/horovod-wheels/<key>/, those for this Python: a target whose install has the same
# key installs one instead of compiling; it must run the OS release they were built on, whose MPI and
# C++ runtime they link), the build tools install.sh uses
# (pip, wheel, setuptools), SHA256SUMS (`sha256sum -c SHA256SUMS` checks a copy) and MADE_FOR
# (the Python, platform and variant the wheels fit). Written as DIR.partial, renamed to DIR when
# complete; a run that broke off resumes from DIR.partial.
set -euo pipefail

step() { printf '[wheelhouse] %s\n' "$*"; }
fail() { printf '[wheelhouse] FAILED at step "%s": %s\n' "$1" "$2" >&2; exit 1; }

# shellcheck source=tools/select_python.sh
source "${BASH_SOURCE[0]%/*}/select_python.sh"
select_python || exit 1

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(realpath -m "${WHEELHOUSE:-$root/wheelhouse}")"
variant="${VARIANT:-cpu}"
reqs="$root/requirements.txt"
partial="$out.partial"
mkdir -p "$partial"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

hvd_pin="$(grep -E '^horovod==' "$reqs")" || fail "requirements" "requirements.txt must pin horovod"
keras_pin="$(grep -E '^tf-keras==' "$reqs")" || fail "requirements" "requirements.txt must pin tf-keras"
grep -vE '^(horovod|tf-keras)==' "$reqs" > "$work/requirements.txt"
if [[ "$variant" == gpu ]]; then
  sed -i "s/^tensorflow-cpu==/tensorflow[and-cuda]==/" "$work/requirements.txt"
fi
platform="$("$python" -c 'import sysconfig; print(sysconfig.get_platform())')"
step "$TF_RELEASE, for $python (Python $python_version, $platform), variant $variant, into $out"

# The interpreter's own pip, so that the wheels chosen are the ones its tags accept.
download=("$python" -m pip --disable-pip-version-check download --dest "$partial")
# install.sh upgrades pip, wheel and setuptools before the build: the newest in the wheelhouse.
"${download[@]}" -q pip wheel setuptools || fail "build tools" "pip download pip wheel setuptools failed"
"${download[@]}" -q -r "$work/requirements.txt" || fail "requirements" "pip download -r requirements.txt failed (see above)"
# tf-keras without its dependencies, as install.sh installs it: it requires `tensorflow`, and pip
# would fetch that second TensorFlow beside tensorflow-cpu.
"${download[@]}" -q --no-deps "$keras_pin" || fail "requirements" "pip download $keras_pin failed"
# Horovod as its sdist only: a wheel would be tied to one TensorFlow and MPI.
"${download[@]}" -q --no-deps --no-binary horovod "$hvd_pin" || fail "horovod" "pip download $hvd_pin (sdist) failed"
"${download[@]}" -q -r <(printf 'cloudpickle\npsutil\npyyaml\npackaging\n') -c "$work/requirements.txt" \
  || fail "horovod" "pip download of Horovod's dependencies failed"

if [[ -n "${HOROVOD_WHEELS:-}" ]]; then
  [[ -d "$HOROVOD_WHEELS" ]] || fail "horovod wheels" "HOROVOD_WHEELS=$HOROVOD_WHEELS is not a folder"
  carried=0
  for key_dir in "$HOROVOD_WHEELS"/*-py"$python_version"-*/; do
    [[ "$key_dir" != *.partial/ ]] || continue   # a build that did not finish
    wheel="$(compgen -G "$key_dir/horovod-*.whl" | head -n1 || true)"
    [[ -n "$wheel" ]] || continue
    key="$(basename "$key_dir")"
    mkdir -p "$partial/horovod-wheels/$key" && cp "$wheel" "$partial/horovod-wheels/$key/"
    step "carrying Horovod's wheel for $key"
    carried=$((carried + 1))
  done
  (( carried )) || step "no Horovod wheel for Python $python_version in $HOROVOD_WHEELS: the target compiles Horovod"
fi

(cd "$partial" && find . -type f ! -name SHA256SUMS ! -name MADE_FOR -printf '%P\n' | LC_ALL=C sort \
  | xargs -d '\n' sha256sum > "$work/SHA256SUMS")
mv "$work/SHA256SUMS" "$partial/SHA256SUMS"
printf 'python %s %s\nplatform %s\nvariant %s\nrequirements %s\nmade %s\n' "$python_version" \
  "$("$python" -c 'import sys; print(sys.implementation.cache_tag)')" "$platform" "$variant" \
  "$(sha256sum < "$reqs" | cut -d' ' -f1)" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$partial/MADE_FOR"
if [[ -e "$out" ]]; then
  rm -rf "$out.old" && mv "$out" "$out.old"
fi
mv "$partial" "$out"
rm -rf "$out.old"
step "done: $(wc -l < "$out/SHA256SUMS") files, $(du -sh "$out" | cut -f1) in $out"
