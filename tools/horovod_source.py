"""Horovod 0.28.1's sdist, unpacked and edited so that it builds against the TensorFlow installed here.

Horovod's last release (0.28.1, 2023) compiles against newer TensorFlow, compilers and CMake only
with small source edits. They are written here, each as the exact text it replaces, and each is
applied only when what it depends on holds for this build (the installed TensorFlow's version, the
C++ standard library's release, CMake's version).
conda-forge's horovod feedstock makes the same changes to build 0.28.1 against TF 2.21.

    python tools/horovod_source.py prepare SDIST DEST   # unpack SDIST into DEST/horovod-0.28.1, edit it
    python tools/horovod_source.py cache-key            # the built wheel's cache key for this venv

Run it with the venv's interpreter: the TensorFlow whose version decides is the one that imports
there. Each edit applied prints one line; a text an edit must change that is not in the file (an
sdist other than the one these edits were written for) is one `error:` line naming the edit, and
exit status 1. Standard library only.
"""

import argparse
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

HOROVOD_VERSION = "0.28.1"


class EditError(Exception):
    """An edit cannot be made: its message is the whole `error:` line."""


def parse_version(text: str) -> tuple[int, ...]:
    """(2, 21, 0) from "2.21.0", "2.21.0rc1" or "cmake version 4.0.2": the leading dotted numbers."""
    match = re.search(r"\d+(?:\.\d+)*", text)
    if not match:
        raise ValueError(f"no version number in {text!r}")
    return tuple(int(part) for part in match.group(0).split("."))


@dataclasses.dataclass(frozen=True)
class BuildFacts:
    """What the edits' guards read: the versions this build compiles against (None: not known)."""

    tensorflow: tuple[int, ...]
    libstdcxx: int | None  # _GLIBCXX_RELEASE of the C++ compiler's standard library
    cmake: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Change:
    """In `path` (relative to the source root), `old` becomes `new`: once, or every time if `every`."""

    path: str
    old: str
    new: str
    every: bool = False

    def is_made(self, text: str) -> bool:
        # An insertion keeps its `old` inside `new`: it is made when `new` is there. A replacement
        # is made when `new` is there and no `old` is left.
        return self.new in text and (self.old in self.new or self.old not in text)


@dataclasses.dataclass(frozen=True)
class Edit:
    """One named source edit: its changes, made when `applies(facts)` holds (`guard` says when)."""

    name: str
    guard: str
    applies: Callable[[BuildFacts], bool]
    why: str
    changes: tuple[Change, ...]


# --- The edits ---------------------------------------------------------------------------------
# The GPU stream helper: a StreamExecutor stream's public handle, for the private AsGpuStreamValue.
_GPU_STREAM_HELPER = """#endif // TENSORFLOW_VERSION >= 2011000000

// TensorFlow 2.21 no longer exports stream_executor::gpu::AsGpuStreamValue; the stream's public
// platform handle is the same CUDA/HIP stream (edit of tools/horovod_source.py).
static GpuStreamHandle GetGpuStreamValue(stream_executor::Stream* stream) {
  return reinterpret_cast<GpuStreamHandle>(stream->platform_specific_handle().stream);
}
#endif // HAVE_GPU
"""

EDITS: tuple[Edit, ...] = (
    Edit(
        name="libstdc++13-includes",
        guard="libstdc++ >= 13",
        applies=lambda f: f.libstdcxx is not None and f.libstdcxx >= 13,
        why="GCC 13's headers no longer include <stdexcept> and <string> through <memory> and <queue>",
        changes=(
            Change(
                "horovod/common/common.h",
                "#include <memory>\n#include <string>\n",
                "#include <memory>\n#include <stdexcept>\n#include <string>\n",
            ),
            Change(
                "horovod/common/group_table.h",
                "#include <queue>\n#include <unordered_map>\n",
                "#include <queue>\n#include <string>\n#include <unordered_map>\n",
            ),
        ),
    ),
    Edit(
        name="xla-builder-path",
        guard="tensorflow >= 2.19",
        applies=lambda f: f.tensorflow >= (2, 19),
        why="TF 2.19 moved xla_builder.h from xla/client/ to xla/hlo/builder/",
        changes=(
            Change(
                "horovod/tensorflow/xla_mpi_ops.cc",
                '#include "tensorflow/compiler/xla/client/xla_builder.h"\n',
                '#include "tensorflow/compiler/xla/hlo/builder/xla_builder.h"\n',
            ),
        ),
    ),
    Edit(
        name="absl-statusor",
        guard="tensorflow >= 2.19",
        applies=lambda f: f.tensorflow >= (2, 19),
        # Not needed to build against TF 2.21's PyPI wheel, whose headers still reach a deprecated
        # xla::StatusOr (a -fsyntax-only check of the unedited line passes); conda-forge's feedstock
        # makes it for its own TF 2.21 build. The alias names absl::StatusOr: the same code, kept
        # for when the deprecated alias goes.
        why="xla::StatusOr is only a deprecated alias of absl::StatusOr in TF >= 2.19's headers",
        changes=(
            Change(
                "horovod/tensorflow/xla_mpi_ops.cc",
                "#include <unordered_map>\n",
                '#include <unordered_map>\n#include "absl/status/statusor.h"\n',
            ),
            Change(
                "horovod/tensorflow/xla_mpi_ops.cc",
                "::xla::StatusOr<::xla::XlaOp>",
                "::absl::StatusOr<::xla::XlaOp>",
                every=True,
            ),
        ),
    ),
    Edit(
        name="tf-external-includes",
        guard="tensorflow >= 2.21",
        applies=lambda f: f.tensorflow >= (2, 21),
        why="TF 2.21's XLA headers include HighwayHash and FarmHash relative to include/external/<repo>",
        changes=(
            Change(
                "horovod/tensorflow/CMakeLists.txt",
                "include_directories(SYSTEM ${Tensorflow_INCLUDE_DIRS})\n",
                "include_directories(SYSTEM ${Tensorflow_INCLUDE_DIRS})\n"
                "include_directories(SYSTEM ${Tensorflow_INCLUDE_DIRS}/external/highwayhash\n"
                "                           ${Tensorflow_INCLUDE_DIRS}/external/farmhash_archive/src)\n",
            ),
        ),
    ),
    Edit(
        name="gpu-stream-handle",
        guard="tensorflow >= 2.21",
        applies=lambda f: f.tensorflow >= (2, 21),
        why="TF 2.21's GPU build no longer exports AsGpuStreamValue (code under HAVE_GPU only)",
        changes=(
            Change(
                "horovod/tensorflow/mpi_ops.cc",
                "// Forward declaration of AsGpuStreamValue\n"
                "namespace stream_executor {\n"
                "namespace gpu {\n"
                "GpuStreamHandle AsGpuStreamValue(Stream* stream);\n"
                "} // namespace stream_executor\n"
                "} // namespace gpu\n",
                "",
            ),
            Change(
                "horovod/tensorflow/mpi_ops.cc",
                "#endif // TENSORFLOW_VERSION >= 2011000000\n#endif // HAVE_GPU\n",
                _GPU_STREAM_HELPER,
            ),
            Change(
                "horovod/tensorflow/mpi_ops.cc",
                "stream_executor::gpu::AsGpuStreamValue(",
                "GetGpuStreamValue(",
                every=True,
            ),
        ),
    ),
    Edit(
        name="cmake4-policy-minimum",
        guard="cmake >= 4",
        applies=lambda f: f.cmake >= (4,),
        why="CMake 4 refuses the cmake_minimum_required(2.8.12) of the bundled gloo and flatbuffers",
        changes=(
            Change(
                "setup.py",
                "'-DPYTHON_EXECUTABLE:FILEPATH=' + sys.executable]",
                "'-DPYTHON_EXECUTABLE:FILEPATH=' + sys.executable,\n"
                "                      '-DCMAKE_POLICY_VERSION_MINIMUM=3.5']",
            ),
        ),
    ),
)


def edits_for(facts: BuildFacts) -> list[Edit]:
    return [edit for edit in EDITS if edit.applies(facts)]


def edits_hash(facts: BuildFacts) -> str:
    """A hash of the text of the edits that apply: a changed edit means a new wheel."""
    spec = [(e.name, [dataclasses.astuple(c) for c in e.changes]) for e in edits_for(facts)]
    return hashlib.sha256(json.dumps(spec).encode()).hexdigest()[:12]


def apply_edit(root: Path, edit: Edit) -> bool:
    """Makes `edit` in the tree at `root`; False if it was made already. Raises EditError, having
    written nothing, when a text it must change is missing."""
    texts: dict[str, str] = {}
    for change in edit.changes:
        file = root / change.path
        if change.path not in texts:
            try:
                texts[change.path] = file.read_text()
            except OSError as e:
                raise EditError(
                    f"horovod edit {edit.name}: cannot read {change.path}: {e.strerror}"
                ) from e
    original = dict(texts)
    for change in edit.changes:
        text = texts[change.path]
        if change.is_made(text):
            continue
        count = text.count(change.old)
        if count == 0 or (count > 1 and not change.every):
            found = "not found" if count == 0 else f"found {count} times, expected once"
            first_line = (
                change.old.strip().splitlines()[0] if change.old.strip() else repr(change.old)
            )
            raise EditError(
                f"horovod edit {edit.name}: {change.path}: the text to change ({first_line!r}) "
                f"is {found}; this is not the Horovod {HOROVOD_VERSION} source the edit was written for"
            )
        texts[change.path] = text.replace(change.old, change.new)
    changed = [path for path in texts if texts[path] != original[path]]
    for path in changed:
        (root / path).write_text(texts[path])
    return bool(changed)


def apply_edits(root: Path, facts: BuildFacts, say: Callable[[str], None] = print) -> list[str]:
    """Applies every edit whose guard holds (one line each, also for those skipped); their names."""
    applied = []
    for edit in EDITS:
        if not edit.applies(facts):
            say(f"[horovod] edit {edit.name}: skipped ({edit.guard} does not hold)")
            continue
        made = apply_edit(root, edit)
        say(
            f"[horovod] edit {edit.name}: {'applied' if made else 'already made'} ({edit.guard}: {edit.why})"
        )
        applied.append(edit.name)
    return applied


def unpack(sdist: Path, dest: Path) -> Path:
    """Unpacks the sdist into dest; the source root it holds (dest/horovod-0.28.1, which must not exist)."""
    root = dest / f"horovod-{HOROVOD_VERSION}"
    if root.exists():
        raise EditError(f"horovod unpack: {root} exists already (unpack into an empty folder)")
    try:
        with tarfile.open(sdist) as tar:
            # The "data" filter (no absolute paths, no links out of dest) where this Python has it.
            options = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(dest, **options)
    except (OSError, tarfile.TarError) as e:
        raise EditError(f"horovod unpack: cannot unpack {sdist}: {e}") from e
    if not (root / "setup.py").is_file():
        raise EditError(f"horovod unpack: {sdist} holds no horovod-{HOROVOD_VERSION}/setup.py")
    return root


# --- The facts of this machine -----------------------------------------------------------------
def installed_tensorflow() -> tuple[int, ...]:
    """The version of the TensorFlow this interpreter imports (what Horovod's CMake will build against)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [sys.executable, "-c", "import tensorflow as tf; print(tf.__version__)"],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        raise EditError(
            f"horovod facts: {sys.executable} cannot import tensorflow "
            f"({(proc.stderr.strip().splitlines() or ['no message'])[-1]})"
        )
    return parse_version(proc.stdout.strip().splitlines()[-1])


def cxx_compiler() -> str:
    # CMake takes $CXX, else c++: the one Horovod is compiled with.
    return os.environ.get("CXX") or "c++"


def libstdcxx_release() -> int | None:
    """_GLIBCXX_RELEASE (GCC's major version) of the compiler's C++ library; None for another library.

    The missing includes are libstdc++ 13's (its headers stopped including each other), so this,
    not the compiler's name, decides: clang on a GCC 13 system needs them too.
    """
    try:
        proc = subprocess.run(
            [cxx_compiler(), "-x", "c++", "-E", "-dM", "-include", "cstddef", "/dev/null"],
            capture_output=True,
            text=True,
        )
    except OSError as e:
        raise EditError(
            f"horovod facts: cannot run the C++ compiler {cxx_compiler()}: {e.strerror}"
        ) from e
    if proc.returncode != 0:
        raise EditError(
            f"horovod facts: {cxx_compiler()} cannot preprocess <cstddef>: {proc.stderr.strip()[:200]}"
        )
    match = re.search(r"#define _GLIBCXX_RELEASE (\d+)", proc.stdout)
    return int(match.group(1)) if match else None


def cmake_version() -> tuple[int, ...]:
    cmake = os.environ.get("HOROVOD_CMAKE") or "cmake"  # setup.py's own choice
    try:
        out = subprocess.run(
            [cmake, "--version"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise EditError(f"horovod facts: cannot run {cmake} --version: {e}") from e
    return parse_version(out)


def facts_of_this_machine() -> BuildFacts:
    return BuildFacts(
        tensorflow=installed_tensorflow(), libstdcxx=libstdcxx_release(), cmake=cmake_version()
    )


def cache_key(facts: BuildFacts) -> str:
    """horovod-0.28.1-tf2.21.0-py3.12-edits<hash>: the built wheel fits any venv with these."""
    tf = ".".join(map(str, facts.tensorflow))
    py = "{}.{}".format(*sys.version_info[:2])
    return f"horovod-{HOROVOD_VERSION}-tf{tf}-py{py}-edits{edits_hash(facts)}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prepare = sub.add_parser(
        "prepare", help="unpack the sdist into DEST and apply the edits that fit"
    )
    prepare.add_argument("sdist", type=Path)
    prepare.add_argument("dest", type=Path)
    sub.add_parser(
        "cache-key", help="print the cache key of the wheel these edits and this TensorFlow build"
    )
    args = parser.parse_args(argv)
    try:
        facts = facts_of_this_machine()
        if args.command == "cache-key":
            print(cache_key(facts))
            return 0
        root = unpack(args.sdist, args.dest)
        apply_edits(root, facts)
    except EditError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
