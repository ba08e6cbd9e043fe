"""Intra-op threads from the rank's own affinity and the launcher's binding (common/parallel/binding.py)."""

import json
import subprocess

import pytest

from common.parallel.binding import cpu_list, intra_op_threads
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
    "import json, os; from common import cpu; from common.parallel.binding import intra_op_threads; "
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
