"""GPUs by NVML UUID, and two ranks on one GPU refused at init (common/parallel/gpus.py).

No GPU exists here, so NVML is a fake: a C file compiled into a libnvidia-ml.so.1 that lists the
GPUs of FAKE_NVML_UUIDS, found by the dynamic loader through LD_LIBRARY_PATH, as the real one is
found on a GPU node. TensorFlow sees no GPU: the check works from NVML alone.
"""

import re
import shutil
import subprocess

import pytest

from common.parallel import gpus
from common.parallel.gpu_sharing import sharing_error
from common.parallel.gpus import RankGpu, visible
from tests import helpers

FAKE_NVML = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* The five NVML calls common/parallel/gpus.py makes; the GPUs' UUIDs come from FAKE_NVML_UUIDS. */
static char uuids[16][96];
static unsigned count;
int nvmlInit_v2(void) {
    const char *list = getenv("FAKE_NVML_UUIDS");
    char copy[1600];
    count = 0;
    if (!list) return 9;   /* NVML_ERROR_DRIVER_NOT_LOADED */
    snprintf(copy, sizeof copy, "%s", list);
    for (char *t = strtok(copy, ","); t && count < 16; t = strtok(NULL, ","))
        snprintf(uuids[count++], sizeof uuids[0], "%s", t);
    return 0;
}
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = count; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **handle) {
    if (i >= count) return 2;   /* NVML_ERROR_INVALID_ARGUMENT */
    *handle = (void *)(uintptr_t)(i + 1);
    return 0;
}
int nvmlDeviceGetUUID(void *handle, char *uuid, unsigned length) {
    unsigned i = (unsigned)(uintptr_t)handle - 1;
    if (i >= count) return 2;
    snprintf(uuid, length, "%s", uuids[i]);
    return 0;
}
"""
A, B = "GPU-0a1b2c3d-0000-4000-8000-00000000000a", "GPU-0a1b2c3d-0000-4000-8000-00000000000b"


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory):
    """A folder holding a fake libnvidia-ml.so.1 (gcc)."""
    if not shutil.which("gcc"):
        pytest.skip("gcc not found: cannot build the fake NVML")
    folder = tmp_path_factory.mktemp("fake_nvml")
    (folder / "fake_nvml.c").write_text(FAKE_NVML)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", "-o", folder / gpus.LIBRARY, folder / "fake_nvml.c"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return folder


def test_uuids_read_through_nvml(fake_nvml, monkeypatch):
    library = str(fake_nvml / gpus.LIBRARY)
    monkeypatch.setenv("FAKE_NVML_UUIDS", f"{A},{B}")
    assert gpus.nvml_uuids(library) == (A, B)
    assert gpus.visible_uuids({"CUDA_VISIBLE_DEVICES": "1"}, library) == (B,)
    monkeypatch.delenv("FAKE_NVML_UUIDS")  # nvmlInit fails: as no driver
    assert gpus.nvml_uuids(library) is None
    assert gpus.nvml_uuids(str(fake_nvml / "absent.so.1")) is None


@pytest.mark.parametrize(
    "value, seen",
    [
        (None, (A, B)),  # unset: every GPU
        ("", ()),
        ("-1", ()),  # none
        ("1", (B,)),
        ("1,0", (B, A)),  # CUDA's order, as written
        (B, (B,)),
        (f"{B},0", (B, A)),  # by UUID, mixed with indices
        ("GPU-0a1b2c3d-0000-4000-8000-00000000000b", (B,)),
        ("GPU-0a1b", ()),  # a prefix of both: names no one GPU, the list ends
        ("0,7,1", (A,)),  # no GPU 7: the list ends there
        ("0,0", (A,)),  # a GPU twice: the list ends at the repeat
        ("MIG-4f1c", ("MIG-4f1c",)),  # a MIG instance, kept as written
    ],
)
def test_cuda_visible_devices_as_cuda_reads_it(value, seen):
    assert visible((A, B), value) == seen


def rank(r, host="node1", local_rank=None, uuid=A, visible_gpus=1):
    return RankGpu(r, host, r if local_rank is None else local_rank, uuid, visible_gpus)


def test_two_ranks_on_one_gpu_are_named_with_host_and_uuid():
    error = sharing_error([rank(0), rank(1), rank(2, uuid=B)])
    assert error.startswith(f"ranks 0 and 1 on node1 would share GPU {A}:") and "\n" not in error
    assert sharing_error([rank(0), rank(1, uuid=B)]) is None
    # One UUID on two hosts is two GPUs' worth of nothing shared: UUIDs are per GPU, hosts are per node.
    assert sharing_error([rank(0, host="node1"), rank(1, host="node2", local_rank=0)]) is None
    # Several GPUs shared: the first is named, the others counted.
    error = sharing_error([rank(0), rank(1), rank(2, uuid=B), rank(3, uuid=B)])
    assert "ranks 0 and 1" in error and "1 more GPU(s) shared" in error


def test_without_nvml_only_a_rank_wrapping_past_several_gpus_is_certain_to_share():
    assert "rank 4 on node1 is local rank 4 but sees 4 GPUs" in sharing_error(
        [rank(r, uuid=None, visible_gpus=4) for r in range(5)]
    )
    assert sharing_error([rank(r, uuid=None, visible_gpus=4) for r in range(4)]) is None
    assert (
        sharing_error([rank(r, uuid=None, visible_gpus=1) for r in range(2)]) is None
    )  # cannot tell
    assert (
        sharing_error([rank(r, uuid=None, visible_gpus=0) for r in range(2)]) is None
    )  # CPU nodes


@pytest.fixture(scope="module")
def small_cosmo_data(tmp_path_factory):
    from cosmoflow import synthetic

    out = tmp_path_factory.mktemp("cosmo_gpus")
    synthetic.generate(out, 32, 32, 16, seed=3, progress=lambda msg: None)
    return out


def _two_ranks(fake_nvml, data, out, uuids: str, wrapper: str = "", *args):
    """cosmoflow/train.py on 2 Gloo ranks, each process seeing the fake NVML's GPUs `uuids`."""
    train = helpers.train_cmd(
        "cosmoflow",
        helpers.REPO / "tests" / "configs" / "cosmoflow_tiny.yaml",
        "--data-dir",
        data,
        "--output-dir",
        out,
        "--n-train",
        "32",
        "--n-valid",
        "16",
        *args,
    )
    cmd = helpers.saying_its_exit_code(train, before=wrapper)
    env = helpers.env() | {"LD_LIBRARY_PATH": str(fake_nvml), "FAKE_NVML_UUIDS": uuids}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    from common import launchers

    return subprocess.run(
        [*launchers.horovodrun(2), *map(str, cmd)],
        env=env,
        cwd=helpers.REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_two_ranks_seeing_one_gpu_each_refuse_at_init_with_exit_2(
    fake_nvml, small_cosmo_data, tmp_path
):
    # Two GPUs on the node, but each rank is shown only the first: both would use GPU A.
    proc = _two_ranks(
        fake_nvml, small_cosmo_data, tmp_path / "run", f"{A},{B}", "export CUDA_VISIBLE_DEVICES=0;"
    )
    output = proc.stdout + proc.stderr
    # Each rank refuses on its own (its error line below); the first to exit 2 makes horovodrun
    # terminate the other, which may then be gone before its shell says its exit code.
    exits = helpers.said_exit_codes(output)
    assert proc.returncode != 0 and exits and set(exits.values()) == {2}, output[-3000:]
    # One line from each rank that got as far (both, but for a rank terminated first).
    errors = [line for line in helpers.error_lines(output) if "would share GPU" in line]
    assert 1 <= len(errors) <= 2, output[-3000:]
    for line in errors:
        assert re.search(
            rf"error: \[rank [01]\] ranks 0 and 1 on \S+ would share GPU {A}:", line
        ), errors
    assert "run_start" not in output


def test_ranks_seeing_their_own_gpu_pass_the_check(fake_nvml, small_cosmo_data, tmp_path):
    # The control, one step through the same path: each rank sees its own GPU, hidden per task
    # (CUDA_VISIBLE_DEVICES=its local rank, as srun --gpus-per-task leaves one per task).
    proc = _two_ranks(
        fake_nvml,
        small_cosmo_data,
        tmp_path / "run",
        f"{A},{B}",
        "export CUDA_VISIBLE_DEVICES=$HOROVOD_LOCAL_RANK;",
        "--benchmark",
        "1",
        "--set",
        "train.benchmark_warmup_steps=0",
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "rank 0 exit 0" in output and "rank 1 exit 0" in output, output[
        -3000:
    ]
    assert "would share GPU" not in output
    # The [init] line says which thread rule applied: horovodrun binds nothing, 2 ranks share this host.
    assert "intra-op threads" in output and "horovodrun binds no CPUs" in output, output[-3000:]
