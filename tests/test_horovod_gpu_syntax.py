"""The GPU-only Horovod edits compile against this TensorFlow's headers and CUDA's (slow tier).

A CPU build never compiles the code under HAVE_GPU, so the gpu-stream-handle edit would go unchecked
on machines without a GPU. Here horovod/tensorflow/mpi_ops.cc, edited as the install edits it, is
parsed with `g++ -fsyntax-only -DHAVE_GPU=1 -DHAVE_CUDA=1` against the installed TensorFlow's
headers and the CUDA headers of the nvidia-cuda-runtime-cu12 and nvidia-cuda-nvcc-cu12 wheels
(crt/host_config.h is in the second), all fetched from PyPI into a temporary folder.
"""

import shutil
import subprocess
import sys
import zipfile

import pytest

from tools import horovod_source as hs

pytestmark = pytest.mark.slow


def cmake_version_number(version):
    """2021000000 for TF 2.21.0, as Horovod's CMake parse_version writes TENSORFLOW_VERSION."""
    major, minor, patch = (tuple(version) + (0, 0))[:3]
    return major * 1_000_000_000 + minor * 1_000_000 + patch * 1_000


def pip_download(dest, *args):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        pytest.skip(f"pip download {' '.join(args)} failed: {proc.stderr.strip()[-200:]}")
    return dest


@pytest.fixture(scope="module")
def gpu_build(tmp_path_factory):
    """(edited source root, compiler flags) for a GPU build of mpi_ops.cc against this TensorFlow."""
    facts = hs.facts_of_this_machine()
    if facts.tensorflow < (2, 21):
        pytest.skip(
            f"TensorFlow {facts.tensorflow} has no GPU-only edit (gpu-stream-handle is for >= 2.21)"
        )
    tmp = tmp_path_factory.mktemp("hvd_gpu")
    sdist = next(
        pip_download(
            tmp / "sdist", "--no-binary", ":all:", f"horovod=={hs.HOROVOD_VERSION}"
        ).iterdir()
    )
    root = hs.unpack(sdist, tmp / "src")
    assert "gpu-stream-handle" in hs.apply_edits(root, facts, say=lambda line: None)
    cuda = []
    # The versions TensorFlow 2.21's [and-cuda] extra allows.
    for wheel, sub in (
        ("nvidia-cuda-runtime-cu12>=12.5.82,<13", "cuda_runtime"),
        ("nvidia-cuda-nvcc-cu12>=12.5.82,<13", "cuda_nvcc"),
    ):
        folder = pip_download(tmp / sub, wheel)
        with zipfile.ZipFile(next(folder.glob("*.whl"))) as whl:
            whl.extractall(folder / "x")
        cuda += ["-isystem", str(folder / "x" / "nvidia" / sub / "include")]
    import tensorflow as tf

    tf_include = tf.sysconfig.get_include()
    third = root / "third_party"
    flags = [
        *tf.sysconfig.get_compile_flags(),
        f"-DTENSORFLOW_VERSION={cmake_version_number(facts.tensorflow)}",
        "-DEIGEN_MPL2_ONLY=1",
        "-DHAVE_GPU=1",
        "-DHAVE_CUDA=1",
        "-isystem",
        f"{tf_include}/external/highwayhash",
        "-isystem",
        f"{tf_include}/external/farmhash_archive/src",
        *cuda,
        f"-I{third}/flatbuffers/include",
        f"-I{third}/lbfgs/include",
        f"-I{third}/HTTPRequest/include",
        f"-I{third}/gloo",
        "-DHAVE_GLOO=1",
        "-pthread",
        "-fPIC",
        *[f"-I{p}" for p in sorted((third / "boost").glob("*/include"))],
    ]
    # As the site's build: with MPI where OpenMPI's compiler wrapper says where its headers are.
    mpi = (
        subprocess.run(["mpicxx", "--showme:incdirs"], capture_output=True, text=True)
        if shutil.which("mpicxx")
        else None
    )
    if mpi is not None and mpi.returncode == 0:
        flags += ["-DHAVE_MPI=1", *[f"-isystem{d}" for d in mpi.stdout.split()]]
    return root, flags


def syntax_check(root, flags, source):
    return subprocess.run(
        [hs.cxx_compiler(), *flags, "-fsyntax-only", str(source)],
        cwd=source.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_edited_gpu_code_compiles_against_tensorflow_and_cuda_headers(gpu_build):
    root, flags = gpu_build
    proc = syntax_check(root, flags, root / "horovod/tensorflow/mpi_ops.cc")
    errors = [line for line in proc.stderr.splitlines() if "error" in line.split(":", 4)[-2:][0]]
    assert proc.returncode == 0, "\n".join(errors[:10]) or proc.stderr[-3000:]


def test_the_check_does_compile_the_gpu_code(gpu_build):
    # Negative control: a line that cannot compile, placed in the helper the edit adds, fails the check.
    root, flags = gpu_build
    source = root / "horovod/tensorflow/mpi_ops.cc"
    broken = source.with_name("mpi_ops_broken.cc")
    text = source.read_text()
    marker = "stream->platform_specific_handle().stream"
    assert marker in text
    broken.write_text(text.replace(marker, "stream->no_such_member().stream"))
    proc = syntax_check(root, flags, broken)
    assert proc.returncode != 0 and "no_such_member" in proc.stderr
