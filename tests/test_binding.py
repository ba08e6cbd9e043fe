"""Intra-op threads from the rank's own affinity and the launcher's binding
(common/cpu.py), and the NUMA-local binding slurm/env.sh gives srun
(common/parallel/gpu_binding.py)."""

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from common.cpu import intra_op_threads
from common.parallel.cpu_binding import cpu_list
from common.parallel.gpu_binding import gpu_affinity, gpu_local_masks
from tests import helpers

FOUR = frozenset(range(4))
# srun with SLURM's task/affinity: what it exports for 2 tasks of 2 CPUs each (--cpu-bind=cores). On this
# 2-CPU host's one-node SLURM 22.05 switched to task/affinity, `srun -n 2 --cpu-bind=cores env` gave
# SLURM_CPU_BIND_TYPE=mask_cpu: and SLURM_CPU_BIND_LIST=0x1,0x2 (the same without --cpu-bind: its
# automatic binding), --cpu-bind=sockets gave 0x3,0x3, and each task's affinity was its mask.
SRUN_CORES = {
    "SLURM_CPU_BIND_TYPE": "mask_cpu:",
    "SLURM_CPU_BIND_LIST": "0x3,0xC",
    "SLURM_CPU_BIND": "quiet,mask_cpu:0x3,0xC",
}


@pytest.mark.parametrize(
    "environ, affinity, local_size, threads, says",
    [
        # Nothing binds: the node's ranks share the mask (a job-wide cgroup shrinks it alike).
        ({}, FOUR, 2, 2, "no launcher binding seen"),
        ({}, FOUR, 1, 4, "the only rank on its node"),
        ({"HOROVOD_RANK": "0"}, FOUR, 4, 1, "horovodrun binds no CPUs"),
        # srun with task/affinity: each task's own mask, not divided again.
        (SRUN_CORES | {"SLURM_LOCALID": "0"}, {0, 1}, 2, 2, "srun bound each task (mask_cpu 0-1)"),
        (SRUN_CORES | {"SLURM_LOCALID": "1"}, {2, 3}, 2, 2, "the task's own 2 CPUs, not divided"),
        # --cpu-bind=sockets, or no binding (one mask for every task): the tasks share it.
        (
            {
                "SLURM_CPU_BIND_TYPE": "mask_cpu:",
                "SLURM_CPU_BIND_LIST": "0x3,0x3",
                "SLURM_LOCALID": "1",
            },
            {0, 1},
            2,
            1,
            "overlapping CPUs",
        ),
        (
            {
                "SLURM_CPU_BIND_TYPE": "mask_cpu:",
                "SLURM_CPU_BIND_LIST": "0xF",
                "SLURM_LOCALID": "1",
            },
            FOUR,
            2,
            2,
            "overlapping CPUs",
        ),
        (
            {"SLURM_CPU_BIND_TYPE": "map_cpu:", "SLURM_CPU_BIND_LIST": "2,3", "SLURM_LOCALID": "0"},
            {2},
            2,
            1,
            "srun bound each task (map_cpu 2)",
        ),
        # A site's GPU-local NUMA domains, one per task, or two tasks per domain.
        (
            {
                "SLURM_CPU_BIND_TYPE": "map_ldom:",
                "SLURM_CPU_BIND_LIST": "3,2,1,0",
                "SLURM_LOCALID": "1",
            },
            FOUR,
            4,
            4,
            "srun bound each task (map_ldom NUMA node(s) 2)",
        ),
        (
            {
                "SLURM_CPU_BIND_TYPE": "map_ldom:",
                "SLURM_CPU_BIND_LIST": "0,0,1,1",
                "SLURM_LOCALID": "1",
            },
            FOUR,
            4,
            2,
            "the same NUMA nodes",
        ),
        # The option without a plugin applying it (task/none: tools/local_slurm.sh), and --cpu-bind=none.
        (
            {"SLURM_CPU_BIND_TYPE": "cores", "SLURM_CPU_BIND_LIST": "cores", "SLURM_LOCALID": "0"},
            FOUR,
            2,
            2,
            "no task plugin applied",
        ),
        ({"SLURM_CPU_BIND_TYPE": "none", "SLURM_LOCALID": "0"}, FOUR, 2, 2, "--cpu-bind=none"),
        # Variables of an enclosing step: their mask is not this process's affinity.
        (SRUN_CORES | {"SLURM_LOCALID": "0"}, FOUR, 2, 2, "the variables describe another process"),
        # horovodrun inside an srun task: its ranks share the task's mask, whatever SLURM says of the task.
        (
            SRUN_CORES | {"SLURM_LOCALID": "0", "HOROVOD_RANK": "1"},
            {0, 1},
            2,
            1,
            "horovodrun binds no CPUs",
        ),
        # Open MPI 4.1.4's mpirun, as `mpirun --bind-to X -np 2 env` showed.
        (
            {
                "OMPI_COMM_WORLD_SIZE": "2",
                "OMPI_MCA_orte_bound_at_launch": "1",
                "OMPI_MCA_hwloc_base_binding_policy": "core",
            },
            {0, 1},
            2,
            2,
            "mpirun bound each rank (--bind-to core)",
        ),
        (
            {
                "OMPI_COMM_WORLD_SIZE": "2",
                "OMPI_MCA_orte_bound_at_launch": "1",
                "OMPI_MCA_hwloc_base_binding_policy": "socket",
            },
            FOUR,
            2,
            2,
            "a socket domain",
        ),
        (
            {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_MCA_orte_bound_at_launch": "1"},
            {0},
            2,
            1,
            "its default for up to 2 processes",
        ),
        (
            {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_MCA_orte_bound_at_launch": "1"},
            FOUR,
            4,
            1,
            "its default for more than 2 processes",
        ),
        (
            {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_MCA_hwloc_base_binding_policy": "none"},
            FOUR,
            2,
            2,
            "mpirun bound no CPUs (--bind-to none)",
        ),
    ],
)
def test_threads_follow_the_launchers_binding(environ, affinity, local_size, threads, says):
    choice = intra_op_threads(environ, affinity, local_size)
    assert choice.threads == threads, choice.rule
    assert says in choice.rule and "\n" not in choice.rule


def test_a_rank_always_gets_one_thread_at_least():
    assert intra_op_threads({}, {0}, 8).threads == 1


def test_cpu_lists_read_as_taskset_writes_them():
    assert cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11" and cpu_list(set()) == "none"


PROBE = (
    "import json, os; from common import cpu; from common.cpu import intra_op_threads; "
    "c = intra_op_threads(os.environ, cpu.affinity(), 2); "
    "print(json.dumps([sorted(cpu.affinity()), c.threads, c.rule]))"
)


def _probe(cpus: str, variables: dict) -> tuple[list, int, str]:
    """The decision in a process that taskset confined to `cpus`, the launcher variables set (2 local ranks)."""
    env = {
        k: v for k, v in helpers.env().items() if not k.startswith(("SLURM_", "OMPI_", "HOROVOD_"))
    }
    proc = subprocess.run(
        ["taskset", "-c", cpus, helpers.PYTHON, "-c", PROBE],
        env=env | variables,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=helpers.REPO,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return tuple(json.loads(proc.stdout))


@pytest.mark.skipif(
    len(__import__("os").sched_getaffinity(0)) < 2, reason="needs 2 CPUs to confine a process to"
)
def test_threads_from_a_real_affinity_under_taskset():
    # Bound by srun to CPUs 0-1 (its mask is this process's affinity): both CPUs, not halved.
    assert _probe("0,1", SRUN_CORES | {"SLURM_LOCALID": "0", "SLURM_CPU_BIND_LIST": "0x3,0xC"})[
        :2
    ] == ([0, 1], 2)
    # The same mask, no launcher variables: 2 ranks share it.
    affinity, threads, rule = _probe("0,1", {})
    assert (affinity, threads) == ([0, 1], 1) and "no launcher binding seen" in rule
    # SLURM says local task 1 has CPU 1, but taskset put this one on CPU 0: not believed.
    affinity, threads, rule = _probe(
        "0",
        {
            "SLURM_CPU_BIND_TYPE": "mask_cpu:",
            "SLURM_CPU_BIND_LIST": "0x1,0x2",
            "SLURM_LOCALID": "1",
        },
    )
    assert (affinity, threads) == ([0], 1) and "describe another process" in rule
    affinity, threads, rule = _probe(
        "0",
        {
            "SLURM_CPU_BIND_TYPE": "mask_cpu:",
            "SLURM_CPU_BIND_LIST": "0x1,0x2",
            "SLURM_LOCALID": "0",
        },
    )
    assert (affinity, threads) == ([0], 1) and "srun bound each task (mask_cpu 0)" in rule
    # Open MPI bound each rank to 2 CPUs (--map-by ...:PE=2 --bind-to core): both.
    assert (
        _probe(
            "0,1",
            {
                "OMPI_COMM_WORLD_SIZE": "2",
                "OMPI_MCA_orte_bound_at_launch": "1",
                "OMPI_MCA_hwloc_base_binding_policy": "core",
            },
        )[1]
        == 2
    )


# The NUMA-local binding of slurm/env.sh: `nvidia-smi topo -m` read by common/parallel/gpu_binding.py.
# The two fixtures are hand-written in nvidia-smi's format (tab-separated, a driver of the 535 series
# and later: "CPU Affinity", "NUMA Affinity", "GPU NUMA ID" columns), from the published topology:
# - nvidia_smi_topo_dgx_h100.txt, a DGX H100: 8 H100 SXM on NVSwitch (NV18), 2 Xeon Platinum 8480C of 56
#   cores with 2 threads each, a NUMA node per socket; GPUs 0-3 on node 0 (CPUs 0-55,112-167), 4-7 on
#   node 1 (56-111,168-223); 12 NICs (the layout of the output pasted in vllm-project/vllm#13855).
# - nvidia_smi_topo_dgx_a100.txt, a DGX A100 (an HGX A100 8-GPU board, NV12): 2 AMD EPYC 7742 of 64
#   cores in NPS4, 8 NUMA nodes, a pair of GPUs on each of nodes 3, 1, 7, 5 in GPU order (as pasted
#   from DGX A100s in NVIDIA/nccl#1505 and NVIDIA/DCGM#149); 10 NICs.
FIXTURES = helpers.REPO / "tests" / "fixtures"
H100 = FIXTURES / "nvidia_smi_topo_dgx_h100.txt"
A100 = FIXTURES / "nvidia_smi_topo_dgx_a100.txt"
# (CPUs, NUMA node) of GPU 0..7 as the published topology gives them, written apart from the fixtures.
H100_GPUS = [("0-55,112-167", 0)] * 4 + [("56-111,168-223", 1)] * 4
A100_GPUS = [
    (cpus, node)
    for cpus, node in [
        ("48-63,176-191", 3),
        ("16-31,144-159", 1),
        ("112-127,240-255", 7),
        ("80-95,208-223", 5),
    ]
    for _ in range(2)
]


def _cpus(text: str) -> frozenset:
    return frozenset(
        c
        for a, _, b in (part.partition("-") for part in text.split(","))
        for c in range(int(a), int(b or a) + 1)
    )


@pytest.mark.parametrize("fixture, published", [(H100, H100_GPUS), (A100, A100_GPUS)])
def test_nvidia_smi_topology_gives_each_gpus_cpus_and_numa_node(fixture, published):
    text = fixture.read_text()
    gpus = [(g.cpus, g.numa) for g in gpu_affinity(text)]
    assert gpus == published
    # A copy from a terminal (runs of spaces for tabs) reads the same.
    assert [(g.cpus, g.numa) for g in gpu_affinity(text.replace("\t", "    "))] == published


def test_a_row_that_lost_a_column_is_refused_not_misread():
    lines = H100.read_text().splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("GPU5\t"))
    cells = lines[row].split("\t")
    lines[row] = "\t".join(
        cells[:9] + cells[10:]
    )  # one NIC column fewer: the NUMA node would be read as CPUs
    with pytest.raises(ValueError, match=f"line {row + 1}: GPU5's row"):
        gpu_affinity("\n".join(lines))
    # The header with a column fewer shifts every row: refused at GPU0.
    lines = H100.read_text().splitlines()
    lines[0] = lines[0].replace("\tNIC11", "")
    with pytest.raises(ValueError, match="line 2: GPU0's row"):
        gpu_affinity("\n".join(lines))
    with pytest.raises(ValueError, match="no GPU row"):
        gpu_affinity("No devices were found\n")


def _check_numa_local(masks, published, each):
    """Every rank's CPUs in its own GPU's domain, `each` of them, whole cores (both threads), no CPU twice."""
    assert len(masks) == len(published)
    for rank, mask in enumerate(masks):
        domain = _cpus(published[rank][0])
        assert mask <= domain and len(mask) == each, (rank, cpu_list(mask))
        # A domain's first threads pair with its second ones (0 with 112): a rank holds both or neither.
        cores = len(domain) // 2
        pairs = dict(zip(sorted(domain)[:cores], sorted(domain)[cores:], strict=True))
        assert all(pairs[c] in mask for c in mask if c in pairs), (rank, cpu_list(mask))
    assert sum(map(len, masks)) == len(frozenset().union(*masks))


def test_each_rank_gets_cpus_of_its_gpus_numa_domain_of_its_own():
    # DGX H100, 8 ranks of 224 CPUs / 8 = 28: a domain's 4 ranks split its 112 CPUs.
    _check_numa_local(gpu_local_masks(gpu_affinity(H100.read_text()), 8, 28), H100_GPUS, 28)
    # DGX A100, 8 ranks of 256 / 8 = 32: a pair of GPUs per NUMA node of 32 CPUs, 16 each.
    _check_numa_local(gpu_local_masks(gpu_affinity(A100.read_text()), 8, 32), A100_GPUS, 16)
    # 4 ranks of 56: each its GPU's domain, the other GPUs' ranks absent.
    _check_numa_local(gpu_local_masks(gpu_affinity(H100.read_text()), 4, 56), H100_GPUS[:4], 28)
    with pytest.raises(ValueError, match="9 local ranks, but nvidia-smi lists 8 GPU"):
        gpu_local_masks(gpu_affinity(H100.read_text()), 9, 1)


SRUN = """#!/bin/bash
printf '%s\\n' "$@" > "$SRUN_ARGS"
echo "${HOROVOD_CYCLE_TIME-unset}" > "$SRUN_ARGS.cycle"
"""


def _run_ranks(tmp_path, nvidia_smi: str | None, **variables) -> tuple[list[str], str]:
    """srun's arguments from slurm/env.sh's run_ranks on one node of 8 tasks and 224 CPUs, with a
    stand-in srun that records them and, unless None, a stand-in nvidia-smi running `nvidia_smi`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stand_ins = {"srun": SRUN} | (
        {"nvidia-smi": f"#!/bin/bash\n{nvidia_smi}\n"} if nvidia_smi else {}
    )
    for name, script in stand_ins.items():
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(stat.S_IRWXU)
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CPU", "HOROVOD_"))
    }
    path = f"{bin_dir}{os.pathsep}{environ['PATH']}"
    if nvidia_smi is None and shutil.which("nvidia-smi", path=path):
        pytest.skip("this host has an nvidia-smi of its own")
    environ |= {
        "PATH": path,
        "REPO": str(helpers.REPO),
        "VENV": str(Path(sys.executable).parent.parent),
        "DATA_DIR": "/data/set",
        "SRUN_ARGS": str(tmp_path / "srun_args"),
        "SLURM_CPUS_ON_NODE": "224",
        "SLURM_NTASKS_PER_NODE": "8",
    } | variables
    proc = subprocess.run(
        ["bash", "-c", "source slurm/env.sh && run_ranks true"],
        env=environ,
        cwd=helpers.REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return (tmp_path / "srun_args").read_text().splitlines(), proc.stdout + proc.stderr


def _cpu_bind(args: list[str]) -> str:
    return next(a.removeprefix("--cpu-bind=") for a in args if a.startswith("--cpu-bind="))


def test_env_sh_binds_a_gpu_nodes_ranks_next_to_their_gpus(tmp_path):
    args, output = _run_ranks(tmp_path, f"cat {H100}")
    assert "--cpus-per-task=28" in args  # 224 CPUs over 8 tasks
    kind, _, masks = _cpu_bind(args).partition(":")
    assert kind == "mask_cpu"
    masks = [frozenset(i for i in range(256) if int(m, 16) >> i & 1) for m in masks.split(",")]
    _check_numa_local(masks, H100_GPUS, 28)
    assert (
        "[sbatch] local rank i next to GPU i (nvidia-smi topo -m): GPU 0-3 (NUMA node 0, CPUs"
        " 0-55,112-167): 28 CPUs a rank; GPU 4-7 (NUMA node 1, CPUs 56-111,168-223): 28 CPUs a rank\n"
    ) in output


@pytest.mark.parametrize(
    "nvidia_smi, says",
    [
        (None, ""),  # a CPU node (this host): no nvidia-smi
        # A node whose driver does not answer: nvidia-smi's own message, exit 9.
        ("echo NVIDIA-SMI has failed >&2; exit 9", "NVIDIA-SMI has failed"),
        # An output without the matrix: the parser's error line, and the binding stays cores.
        ("echo No devices were found", "error: nvidia-smi topo -m: no GPU row"),
    ],
)
def test_env_sh_keeps_cores_where_nvidia_smi_gives_no_topology(tmp_path, nvidia_smi, says):
    args, output = _run_ranks(tmp_path, nvidia_smi)
    assert _cpu_bind(args) == "cores" and says in output
    assert "--cpus-per-task=28" in args


def test_env_sh_keeps_the_sites_cpu_bind(tmp_path):
    args, _ = _run_ranks(tmp_path, f"cat {H100}", CPU_BIND="map_ldom:0,0,0,0,1,1,1,1")
    assert _cpu_bind(args) == "map_ldom:0,0,0,0,1,1,1,1"


# nvidia-smi on a GPU node: `-L` lists the GPUs, `topo -m` prints the H100 fixture.
GPU_NODE = f'if [[ $1 == -L ]]; then echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"; else cat {H100}; fi'


@pytest.mark.parametrize(
    "nvidia_smi, variables, cycle, says",
    [
        (GPU_NODE, {}, "0.1", "cycle 0.1 ms (a GPU node);"),
        (GPU_NODE, {"HOROVOD_CYCLE_TIME": "0.5"}, "0.5", "cycle 0.5 ms;"),  # the site's value
        (GPU_NODE, {"HOROVOD_AUTOTUNE": "1"}, "unset", "cycle as the launcher sets it"),
        (None, {}, "unset", "cycle as the launcher sets it"),  # a CPU node: Horovod's 1 ms
        # The control: an nvidia-smi that lists no GPU leaves the cycle to Horovod.
        ("echo No devices were found", {}, "unset", "cycle as the launcher sets it"),
    ],
)
def test_env_sh_gives_a_gpu_node_a_short_horovod_cycle(
    tmp_path, nvidia_smi, variables, cycle, says
):
    _, output = _run_ranks(tmp_path, nvidia_smi, **variables)
    assert (tmp_path / "srun_args.cycle").read_text().strip() == cycle
    assert says in output, output


def test_the_sbatch_scripts_ask_for_whole_nodes():
    scripts = sorted((helpers.REPO / "slurm").glob("*.sbatch"))
    assert scripts
    for script in scripts:
        assert re.search(r"^#SBATCH --exclusive$", script.read_text(), re.M), script.name
