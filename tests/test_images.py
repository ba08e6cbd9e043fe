"""docker/Dockerfile.cpu built and run for real, on a Docker engine this module starts itself, and
its Apptainer image (`make sif`) run under `apptainer exec` and under SLURM (2 tasks over PMIx).

No image registry is reachable from the test machines, and pip inside a container cannot reach
PyPI (its TLS verification fails there), so the module makes what the build needs itself, once:
the wheelhouse (`tools/wheelhouse.sh`, as `make wheelhouse`), a Debian bookworm base image
(`debootstrap` from Debian's packages, `docker import`), passed as --build-arg BASE_IMAGE, and a
Docker engine of its own (tools/local_docker.sh). Everything lives in the pytest run's temporary
directory and is removed at the end. Skipped, saying why, without root, dockerd, debootstrap or a
python3.11 to make the wheelhouse for (bookworm's Python); the SIF is not skipped: a host without
Apptainer makes its own (tools/apptainer.sh) or the test fails. Its time in CI: docs/testing.md.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.run.report import check_log
from offline.submission import code_files
from tests import helpers

pytestmark = [pytest.mark.slow, pytest.mark.images, pytest.mark.system]

LOCAL_DOCKER = helpers.REPO / "tools" / "local_docker.sh"
BOOKWORM_MIRROR = "http://deb.debian.org/debian"
IMAGE = "mlperf-hpc-tf:cpu"  # the tag docker/Dockerfile.cpu's header builds
HOST_WHEELS = (
    Path(sys.prefix) / "horovod-wheels"
)  # the Horovod wheels tools/install.sh kept in this venv
BASE = "mlperf-test/bookworm:debootstrap"
# What `make image` passes as GIT_COMMIT: this checkout's commit (CI's is a git clone; the image
# itself has neither git nor .git).
COMMIT = (
    shutil.which("git")
    and subprocess.run(
        ["git", "-C", str(helpers.REPO), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
) or "unknown"
APPTAINER = shutil.which("apptainer") or str(helpers.REPO / "tools" / "apptainer.sh")


def sh(cmd, environ, timeout, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in cmd], env=environ, capture_output=True, text=True, timeout=timeout, **kw
    )


def must(proc: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"{what} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """The environment of a running Docker engine of this module's own (stopped and removed at the end)."""
    missing = [tool for tool in ("dockerd", "docker", "debootstrap") if shutil.which(tool) is None]
    if os.geteuid() != 0:
        pytest.skip("the Docker engine and debootstrap need root")
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not found (Debian: apt-get install docker.io debootstrap; .ci/run does)"
        )
    state = tmp_path_factory.mktemp("docker")
    proc = subprocess.run(
        ["bash", str(LOCAL_DOCKER), "start", str(state)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        pytest.skip(f"dockerd does not start here: {proc.stderr.strip()[-300:]}")
    try:
        yield dict(os.environ, DOCKER_HOST=f"unix://{state}/docker.sock")
    finally:
        subprocess.run(
            ["bash", str(LOCAL_DOCKER), "stop", str(state)], capture_output=True, timeout=120
        )
        shutil.rmtree(state / "root", ignore_errors=True)  # the images: GBs


@pytest.fixture(scope="module")
def context(tmp_path_factory):
    """A build context: the repository's files and a wheelhouse made by tools/wheelhouse.sh for Python 3.11."""
    python311 = shutil.which("python3.11")
    if python311 is None:
        pytest.skip(
            "no python3.11 to make the wheelhouse for the image's Python (Debian bookworm: 3.11)"
        )
    ctx = tmp_path_factory.mktemp("context")
    for f in code_files(helpers.REPO):
        dest = ctx / f.relative_to(helpers.REPO)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest)
    start = time.monotonic()
    # With the Horovod wheels this suite's own install built: where this host runs the image's Debian
    # release and the suite's venv the image's Python (CI's), the image installs that wheel instead
    # of compiling Horovod a second time.
    carry = {"HOROVOD_WHEELS": str(HOST_WHEELS)} if HOST_WHEELS.is_dir() else {}
    proc = sh(
        ["bash", helpers.REPO / "tools" / "wheelhouse.sh"],
        dict(os.environ, PYTHON=python311, WHEELHOUSE=str(ctx / "wheelhouse"), **carry),
        timeout=1200,
    )
    if proc.returncode != 0:
        pytest.skip(
            f"the wheelhouse cannot be made here (PyPI unreachable?): {proc.stderr.strip()[-300:]}"
        )
    print(
        f"\n[images] wheelhouse: {time.monotonic() - start:.0f} s; {proc.stdout.strip().splitlines()[-1]}"
    )
    return ctx


@pytest.fixture(scope="module")
def roots(engine, tmp_path_factory):
    """The two Debian roots the tier needs, both started at once in the background (package
    downloads and dpkg, alongside the wheelhouse and the image's build): bookworm with Python 3.11,
    venv and headers for the base image, and Debian unstable's Apptainer for tools/apptainer.sh
    (none when the host has apptainer). -> {name: (Popen, what it makes)}."""
    started = {}
    rootfs = tmp_path_factory.mktemp("rootfs")
    started["bookworm"] = (
        _background(
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-venv,python3-dev",
            "bookworm",
            rootfs,
            BOOKWORM_MIRROR,
            environ=engine,
        ),
        rootfs,
    )
    if not shutil.which("apptainer"):
        root = tmp_path_factory.mktemp("apptainer") / "root"
        started["apptainer"] = (
            _background(APPTAINER, "version", environ=os.environ | {"APPTAINER_ROOT": str(root)}),
            root,
        )
    yield started
    for proc, _ in started.values():
        proc.kill()
        proc.wait()


def _background(*cmd, environ) -> subprocess.Popen:
    return subprocess.Popen(
        [str(c) for c in cmd],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finished(roots, name: str, timeout: int = 1200):
    """(exit code, output, what it made) of a root started by `roots`, once it has ended."""
    proc, made = roots[name]
    output, _ = proc.communicate(timeout=timeout)
    return proc.returncode, output, made


@pytest.fixture(scope="module")
def base_image(engine, roots):
    """Debian bookworm with Python 3.11, venv and headers, from Debian's packages, imported as an image."""
    start = time.monotonic()
    code, output, rootfs = _finished(roots, "bookworm")
    if code != 0:
        pytest.skip(f"debootstrap of bookworm failed (no Debian mirror?): {output.strip()[-300:]}")
    shutil.rmtree(
        rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True
    )  # the .debs, not needed
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    imported = subprocess.run(
        ["docker", "import", "-", BASE],
        stdin=tar.stdout,
        env=engine,
        capture_output=True,
        text=True,
        timeout=600,
    )
    tar.wait()
    must(imported, "docker import")
    print(
        f"\n[images] base image {BASE} (waited for debootstrap, imported): {time.monotonic() - start:.0f} s"
    )
    shutil.rmtree(rootfs, ignore_errors=True)
    return BASE


@pytest.fixture(scope="module")
def image(engine, roots, context, base_image):
    """docker/Dockerfile.cpu built on the debootstrap base: (tag, build output, seconds, bytes)."""
    start = time.monotonic()
    proc = must(
        sh(
            [
                "docker",
                "build",
                "--build-arg",
                f"BASE_IMAGE={base_image}",
                "--build-arg",
                f"GIT_COMMIT={COMMIT}",
                "-f",
                context / "docker" / "Dockerfile.cpu",
                "-t",
                IMAGE,
                context,
            ],
            engine,
            timeout=2400,
        ),
        "docker build",
    )
    seconds = time.monotonic() - start
    size = int(
        must(
            sh(["docker", "image", "inspect", "-f", "{{.Size}}", IMAGE], engine, 60), "inspect"
        ).stdout
    )
    print(
        f"\n[images] docker build -f docker/Dockerfile.cpu: {seconds:.0f} s, image {size / 1e9:.2f} GB "
        f"({os.cpu_count()} CPUs)"
    )
    return IMAGE, proc.stdout, seconds, size


def run_in(image_tag, engine, *cmd, timeout=900) -> subprocess.CompletedProcess:
    # OpenMPI's shared-memory transport needs more than Docker's 64 MB /dev/shm for 2 ranks.
    return sh(["docker", "run", "--rm", "--shm-size=1g", image_tag, *cmd], engine, timeout=timeout)


def test_the_image_installs_from_the_wheelhouse_alone_and_leaves_it_out(image, engine, context):
    tag, output, _, size = image
    assert "[install] installing from the wheelhouse /tmp/wheelhouse only (no index)" in output
    # Horovod: the wheel the wheelhouse carries for the image's key, else compiled from its sdist.
    carried = sorted(
        p.parent.name for p in (context / "wheelhouse").glob("horovod-wheels/*/horovod-*.whl")
    )
    installed = re.search(
        r"\[install\] installing horovod==\S+ from the wheelhouse's wheel for (\S+) ", output
    )
    if installed:
        assert installed[1] in carried, (installed[1], carried)
    else:
        assert "[install] building horovod==" in output, output[-3000:]
    print(
        f"\n[images] Horovod {'from the wheel for ' + installed[1] if installed else 'compiled in the image'}; "
        f"the wheelhouse carried {carried or 'none'}"
    )
    assert "Available Controllers" in output and "[X] MPI" in output and "[X] Gloo" in output
    probe = run_in(
        tag,
        engine,
        "bash",
        "-c",
        "ls /tmp/wheelhouse /opt/mlperf-hpc/wheelhouse 2>&1; ls /usr/bin; command -v mpirun",
    )
    assert probe.stdout.count("No such file or directory") == 2, probe.stdout
    # The compilers (gcc-12, g++-12, gfortran-12, ...) stayed in the build stage; mpirun came along.
    assert probe.stdout.strip().splitlines()[-1] == "/usr/bin/mpirun", probe.stdout
    compilers = re.findall(r"^(?:gcc|g\+\+|gfortran)(?:-\d+)?$", probe.stdout, re.M)
    assert not compilers, compilers
    assert size < 3e9


@pytest.fixture(scope="module")
def sif(image, engine, roots, tmp_path_factory):
    """`make sif` of the image: the SIF, with its .sha256 beside it, and the environment that runs
    Apptainer (the host's, else tools/apptainer.sh with the Debian unstable root `roots` made)."""
    out = tmp_path_factory.mktemp("sif") / "mlperf-hpc-tf-cpu.sif"
    environ = dict(engine)
    if "apptainer" in roots:
        code, output, root = _finished(roots, "apptainer")
        # No skip: a host without Apptainer makes its own from Debian's package service, or fails.
        assert code == 0, output[-3000:]
        environ["APPTAINER_ROOT"] = str(root)
    start = time.monotonic()
    # zstd, not the default gzip: the same build, its squashfs packed in seconds, not minutes.
    make = ["make", "-C", helpers.REPO, "sif", f"IMAGE={image[0]}", f"SIF={out}"]
    proc = sh([*make, "MKSQUASHFS_ARGS=-comp zstd -Xcompression-level 3"], environ, 1800)
    assert proc.returncode == 0, helpers.failure_output(proc)
    digest = (out.parent / f"{out.name}.sha256").read_text().split()
    assert digest[1] == out.name and len(digest[0]) == 64
    print(
        f"\n[images] make sif ({'host apptainer' if shutil.which('apptainer') else 'tools/apptainer.sh'}): "
        f"{time.monotonic() - start:.0f} s, {out.stat().st_size / 1e9:.2f} GB"
    )
    return out, digest[0], environ


@pytest.fixture(scope="module")
def sif_easy_data(sif, tmp_path_factory):
    """The suite's easy CosmoFlow set (tests/conftest.py EASY), made by the SIF's own Python and code
    under `apptainer exec` (nothing of this checkout bound in; its folder bound in)."""
    from tests.conftest import EASY, EASY_ARGS

    path, _, environ = sif
    folder = tmp_path_factory.mktemp("sif-data")
    proc = sh(
        [
            APPTAINER,
            "exec",
            "--no-home",
            "--bind",
            folder,
            path,
            "bash",
            "-c",
            "python -c 'import sys, cosmoflow; print(sys.executable, cosmoflow.__file__)' && "
            f"cd /opt/mlperf-hpc && python -m cosmoflow.synthetic --output-dir {folder}/data "
            f"--size {EASY['size']} {' '.join(EASY_ARGS)} --seed {EASY['seed']} "
            f"--target-spread {EASY['target_spread']}",
        ],
        environ,
        timeout=900,
        cwd=folder,
    )
    assert proc.returncode == 0, helpers.failure_output(proc)
    assert proc.stdout.startswith(
        "/opt/mlperf-hpc/.venv/bin/python /opt/mlperf-hpc/cosmoflow/__init__.py"
    ), proc.stdout[:300]
    return folder / "data"


def sif_job(script, slurm_cluster, sif, tmp_path, data, config, extra_args, log_check="passed"):
    """slurm/SCRIPT with CONTAINER=the SIF, 2 tasks, a STAGE_DIR whose parent does not exist, from a
    submit directory that holds only slurm/ and tools/: the image's code runs, or nothing does."""
    submit = tmp_path / "submit"
    for folder in ("slurm", "tools"):
        shutil.copytree(helpers.REPO / folder, submit / folder)
    stage_parent = Path(f"/tmp/mlperf-sif-{os.getpid()}-{time.monotonic_ns()}")
    assert not stage_parent.exists()
    out = tmp_path / "run"
    environ = {k: v for k, v in sif[2].items() if k != "PYTHONPATH"} | {
        "SLURM_CONF": str(slurm_cluster),
        "REPO": str(submit),
        "CONTAINER": str(sif[0]),
        "APPTAINER": APPTAINER,
        "DATA_DIR": str(data),
        "CONFIG": config,  # in the image, relative to /opt/mlperf-hpc
        "OUTPUT_DIR": str(out),
        "STAGE_DIR": str(stage_parent / "stage"),
        "EXTRA_ARGS": " ".join(["--set", "runtime.record_shards=true", *extra_args]),
    }
    job_out = tmp_path / "job.out"
    try:
        proc = sh(
            ["sbatch", "--wait", "-N", "1", "-n", "2", "-o", job_out, submit / "slurm" / script],
            environ,
            900,
            cwd=tmp_path,
        )
    finally:
        shutil.rmtree(stage_parent, ignore_errors=True)
    log_text = job_out.read_text() if job_out.exists() else "(no job output)"
    print(log_text[-3000:])  # shown in the test report and the closing note
    assert proc.returncode == 0, proc.stdout + proc.stderr + log_text[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "success" and summary["log_check"] == log_check, summary
    assert summary["ranks"] == 2 and summary["nodes"] == 1
    # Wired by SLURM's PMIx through the image's OpenMPI, not by horovodrun's Gloo rendezvous.
    assert summary["controller"] == "mpi"
    assert summary["launcher"]["SLURM_NTASKS"] == "2" and "SLURM_JOB_ID" in summary["launcher"]
    assert summary["staging"]["files"] > 0 and summary["weights_in_sync"]
    # The image the result came from: the SIF and its SHA-256, and the commit it was built from.
    assert summary["runtime"]["image"] == {
        "runtime": "apptainer",
        "image": str(sif[0]),
        "sha256": sif[1],
        "commit": COMMIT,
    }
    log = (out / "mlperf.log").read_text()
    assert '"key": "number_of_ranks", "value": 2' in log and '"key": "staging_start"' in log
    shards = [json.loads((out / "shards" / f"rank-{r:05d}.json").read_text()) for r in (0, 1)]
    assert not set(shards[0]["train"]) & set(shards[1]["train"])
    return summary


def test_sbatch_cosmoflow_trains_both_ranks_in_the_sif_to_the_target(
    slurm_cluster, sif, sif_easy_data, tmp_path
):
    from tests.conftest import EASY_ARGS

    sif_job(
        "cosmoflow.sbatch",
        slurm_cluster,
        sif,
        tmp_path,
        sif_easy_data,
        "tests/configs/cosmoflow_tiny.yaml",
        EASY_ARGS,
    )
    passed, output = check_log(tmp_path / "run" / "mlperf.log")  # the host's official checker too
    assert passed, output


def test_sbatch_deepcam_runs_both_ranks_in_the_sif_under_pmix(
    slurm_cluster, sif, deepcam_data, tmp_path
):
    # The job, not the learning: one epoch of 8 samples, a target met at its evaluation (the run ends
    # successful) and so no official check (it asks IoU >= 0.82). A DeepCAM run to 0.82 whose log
    # passes the checker: test_deepcam_end_to_end.py; the checker passing in the SIF's job: CosmoFlow's.
    data = tmp_path / "data"
    helpers.copy_deepcam_subset(deepcam_data, data, n_train=8, n_valid=4)
    summary = sif_job(
        "deepcam.sbatch",
        slurm_cluster,
        sif,
        tmp_path,
        data,
        "tests/configs/deepcam_tiny.yaml",
        ["--local_batch_size", "2", "--max_epochs", "1", "--set", "target_iou=0.01"]
        + ["--set", "runtime.check_log=false", *helpers.DEEPCAM_NARROW],
        log_check="not checked",
    )
    assert summary["epochs"] == 1, summary


def test_two_ranks_under_mpirun_allreduce_in_the_image(image, engine):
    script = (
        "import horovod.tensorflow as hvd, tensorflow as tf; hvd.init(); "
        "total = hvd.allreduce(tf.constant([hvd.rank() + 1.0]), op=hvd.Sum); "
        "print(f'rank {hvd.rank()} of {hvd.size()} mpi {hvd.mpi_enabled()} sum {float(total[0])}')"
    )
    proc = run_in(
        image[0],
        engine,
        "mpirun",
        "--oversubscribe",
        "-np",
        "2",
        "python",
        "-c",
        script,
        timeout=300,
    )
    assert proc.returncode == 0, helpers.failure_output(proc)
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank "))
    assert lines == ["rank 0 of 2 mpi True sum 3.0", "rank 1 of 2 mpi True sum 3.0"], proc.stdout


def test_make_test_imports_every_test_module_in_the_image(image, engine):
    proc = run_in(image[0], engine, "make", "test", "PYTEST_ARGS=--collect-only -q", timeout=600)
    assert proc.returncode == 0, helpers.failure_output(proc)
    assert (
        "[install]" not in proc.stdout
    )  # `make install` found the image's stack as built: nothing redone
    collected = re.search(
        r"(\d+)(?:/\d+)? tests collected", proc.stdout
    )  # "407/424 tests collected (17 deselected)"
    assert collected and int(collected[1]) > 100, proc.stdout[-2000:]
