"""tools/horovod_source.py on a small fake of Horovod 0.28.1's source: each edit made when its guard
holds and not otherwise, a second pass changes nothing, a text that is not there is refused."""

import tarfile

import pytest

from tools import horovod_source as hs
from tools.horovod_source import BuildFacts

# The lines of Horovod 0.28.1 that the edits change, with a little of what surrounds them there.
FAKE_TREE = {
    "setup.py": (
        "        cmake_args = ['-DCMAKE_BUILD_TYPE=' + config,\n"
        "                      '-DCMAKE_LIBRARY_OUTPUT_DIRECTORY_{}={}'.format(config.upper(), build_dir),\n"
        "                      '-DPYTHON_EXECUTABLE:FILEPATH=' + sys.executable]\n"
    ),
    "horovod/common/common.h": (
        "#include <functional>\n#include <memory>\n#include <string>\n#include <unordered_map>\n"
    ),
    "horovod/common/group_table.h": (
        "#include <mutex>\n#include <queue>\n#include <unordered_map>\n#include <vector>\n"
    ),
    "horovod/tensorflow/xla_mpi_ops.cc": (
        "#include <thread>\n#include <unordered_map>\n\n\n#if TENSORFLOW_VERSION >= 2006000000\n"
        '#include "tensorflow/compiler/tf2xla/xla_op_registry.h"\n'
        '#include "tensorflow/compiler/xla/client/xla_builder.h"\n'
        '#include "tensorflow/compiler/xla/service/custom_call_target_registry.h"\n'
        "private:\n  ::xla::StatusOr<::xla::XlaOp> BuildAllreduceCustomCall(\n"
        "::xla::StatusOr<::xla::XlaOp> HVDAllreduceOp::BuildAllreduceCustomCall(\n"
    ),
    "horovod/tensorflow/CMakeLists.txt": (
        'set(FLATBUFFERS_INCLUDE_PATH "${TF_FLATBUFFERS_INCLUDE_PATH}")\n\n'
        "include_directories(SYSTEM ${Tensorflow_INCLUDE_DIRS})\n"
        "list(APPEND TF_LINKER_LIBS ${Tensorflow_LIBRARIES})\n"
    ),
    "horovod/tensorflow/mpi_ops.cc": (
        "#endif // HAVE_CUDA, HAVE_ROCM\n\n"
        "// Forward declaration of AsGpuStreamValue\nnamespace stream_executor {\nnamespace gpu {\n"
        "GpuStreamHandle AsGpuStreamValue(Stream* stream);\n} // namespace stream_executor\n} // namespace gpu\n"
        '#if TENSORFLOW_VERSION >= 2011000000\n#include "tensorflow/compiler/xla/stream_executor/stream.h"\n'
        '#else\n#include "tensorflow/stream_executor/stream.h"\n#endif // TENSORFLOW_VERSION >= 2011000000\n'
        "#endif // HAVE_GPU\n\n"
        "  auto stream = stream_executor::gpu::AsGpuStreamValue(device_context->stream());\n"
        "              auto stream = stream_executor::gpu::AsGpuStreamValue(\n"
        "                  device_context->stream());\n"
    ),
}

OLD = BuildFacts(
    tensorflow=(2, 15, 1), libstdcxx=12, cmake=(3, 25, 1)
)  # older than every edit's guard
NEW = BuildFacts(tensorflow=(2, 21, 0), libstdcxx=13, cmake=(4, 0, 2))
EDIT_NAMES = [edit.name for edit in hs.EDITS]


def fake_tree(root):
    for path, text in FAKE_TREE.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def read_tree(root):
    return {path: (root / path).read_text() for path in FAKE_TREE}


def applied(root, facts):
    lines = []
    names = hs.apply_edits(root, facts, say=lines.append)
    return names, lines


def test_every_edit_is_made_when_its_guard_holds(tmp_path):
    names, lines = applied(fake_tree(tmp_path), NEW)
    assert names == EDIT_NAMES
    assert [line.split(":")[0] for line in lines] == [f"[horovod] edit {n}" for n in EDIT_NAMES]
    assert all(": applied (" in line for line in lines)
    tree = read_tree(tmp_path)
    assert (
        "#include <memory>\n#include <stdexcept>\n#include <string>\n"
        in tree["horovod/common/common.h"]
    )
    assert "#include <queue>\n#include <string>\n" in tree["horovod/common/group_table.h"]
    xla = tree["horovod/tensorflow/xla_mpi_ops.cc"]
    assert '"tensorflow/compiler/xla/hlo/builder/xla_builder.h"' in xla and "xla/client/" not in xla
    assert '#include "absl/status/statusor.h"' in xla
    assert xla.count("::absl::StatusOr<::xla::XlaOp>") == 2 and "::xla::StatusOr" not in xla
    cmake = tree["horovod/tensorflow/CMakeLists.txt"]
    assert "${Tensorflow_INCLUDE_DIRS}/external/highwayhash" in cmake
    assert "${Tensorflow_INCLUDE_DIRS}/external/farmhash_archive/src" in cmake
    mpi_ops = tree["horovod/tensorflow/mpi_ops.cc"]
    assert "AsGpuStreamValue(" not in mpi_ops.replace(
        "no longer exports stream_executor::gpu::AsGpuStreamValue;", ""
    )
    assert mpi_ops.count("GetGpuStreamValue(") == 3  # the helper and its two calls
    # The helper sits inside HAVE_GPU, after stream.h declares Stream: a CPU build never sees it.
    assert (
        mpi_ops.index("stream_executor/stream.h")
        < mpi_ops.index("static GpuStreamHandle")
        < mpi_ops.index("#endif // HAVE_GPU")
    )
    assert "'-DCMAKE_POLICY_VERSION_MINIMUM=3.5']" in tree["setup.py"]


def test_no_edit_is_made_when_no_guard_holds(tmp_path):
    names, lines = applied(fake_tree(tmp_path), OLD)
    assert names == []
    assert all(line.endswith("does not hold)") for line in lines) and len(lines) == len(EDIT_NAMES)
    assert read_tree(tmp_path) == FAKE_TREE


@pytest.mark.parametrize(
    "facts, expected",
    [
        (BuildFacts((2, 19, 1), 12, (3, 25)), ["xla-builder-path", "absl-statusor"]),
        (BuildFacts((2, 15, 1), 13, (3, 25)), ["libstdc++13-includes"]),
        (BuildFacts((2, 15, 1), None, (3, 25)), []),  # not libstdc++ (libc++): no includes edit
        (BuildFacts((2, 15, 1), 12, (4, 1)), ["cmake4-policy-minimum"]),
        (
            BuildFacts((2, 21, 0), 12, (3, 25)),
            ["xla-builder-path", "absl-statusor", "tf-external-includes", "gpu-stream-handle"],
        ),
    ],
)
def test_each_guard_alone_brings_its_edits(tmp_path, facts, expected):
    names, _ = applied(fake_tree(tmp_path), facts)
    assert names == expected
    changed = {path for path, text in read_tree(tmp_path).items() if text != FAKE_TREE[path]}
    touched = {c.path for e in hs.EDITS if e.name in expected for c in e.changes}
    assert changed == touched


def test_a_second_pass_changes_nothing(tmp_path):
    root = fake_tree(tmp_path)
    applied(root, NEW)
    once = read_tree(root)
    names, lines = applied(root, NEW)
    assert names == EDIT_NAMES
    assert all(": already made (" in line for line in lines)
    assert read_tree(root) == once


def test_a_text_that_is_not_there_is_refused_naming_the_edit_and_nothing_is_written(tmp_path):
    root = fake_tree(tmp_path)
    xla = root / "horovod/tensorflow/xla_mpi_ops.cc"
    # Negative control: the same tree with the StatusOr line changed, as another release might have it.
    xla.write_text(
        FAKE_TREE["horovod/tensorflow/xla_mpi_ops.cc"].replace("::xla::StatusOr<", "xla::StatusOr<")
    )
    before = read_tree(root)
    with pytest.raises(
        hs.EditError,
        match=r"^horovod edit absl-statusor: horovod/tensorflow/xla_mpi_ops.cc: "
        r"the text to change \('::xla::StatusOr<::xla::XlaOp>'\) is not found",
    ):
        hs.apply_edit(root, next(e for e in hs.EDITS if e.name == "absl-statusor"))
    assert read_tree(root) == before  # its first change (the include) was not written either


def test_a_text_found_twice_where_once_is_expected_is_refused(tmp_path):
    root = fake_tree(tmp_path)
    cmake = root / "horovod/tensorflow/CMakeLists.txt"
    cmake.write_text(cmake.read_text() * 2)
    with pytest.raises(
        hs.EditError, match="tf-external-includes: .* is found 2 times, expected once"
    ):
        hs.apply_edit(root, next(e for e in hs.EDITS if e.name == "tf-external-includes"))


def sdist(tmp_path, tree):
    src = tmp_path / "src" / f"horovod-{hs.HOROVOD_VERSION}"
    fake_tree(src)
    for path, text in tree.items():
        (src / path).write_text(text)
    archive = tmp_path / f"horovod-{hs.HOROVOD_VERSION}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    return archive


def test_prepare_unpacks_edits_and_says_each_edit(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hs, "facts_of_this_machine", lambda: NEW)
    assert hs.main(["prepare", str(sdist(tmp_path, {})), str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == [f"[horovod] edit {n}" for n in EDIT_NAMES]
    assert (
        "stdexcept"
        in (tmp_path / "out" / f"horovod-{hs.HOROVOD_VERSION}/horovod/common/common.h").read_text()
    )


def test_prepare_of_another_source_is_one_error_line_and_status_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hs, "facts_of_this_machine", lambda: NEW)
    archive = sdist(tmp_path, {"horovod/tensorflow/CMakeLists.txt": "include_directories(${TF})\n"})
    assert hs.main(["prepare", str(archive), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        "error: horovod edit tf-external-includes: "
        "horovod/tensorflow/CMakeLists.txt: the text to change"
    )


def test_the_cache_key_names_tensorflow_python_and_the_edits_that_apply():
    new, old = hs.cache_key(NEW), hs.cache_key(OLD)
    assert new.startswith(f"horovod-{hs.HOROVOD_VERSION}-tf2.21.0-py") and "-edits" in new
    assert new != old and old.startswith(f"horovod-{hs.HOROVOD_VERSION}-tf2.15.1-py")
    # Facts that change no edit's guard leave the key alone (CMake 3.25 vs 3.28 builds the same wheel).
    assert hs.cache_key(BuildFacts((2, 15, 1), 12, (3, 28))) == old


@pytest.mark.parametrize(
    "text, version",
    [("2.21.0", (2, 21, 0)), ("2.21.0rc1", (2, 21, 0)), ("cmake version 4.0.2\n", (4, 0, 2))],
)
def test_versions_are_read_from_their_leading_numbers(text, version):
    assert hs.parse_version(text) == version
