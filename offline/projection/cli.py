"""Projects a benchmark's time to train at N nodes of a described machine, term by term.

  python -m offline.projection --benchmark cosmoflow --machine machines/perlmutter-a100.yaml --nodes 16,32,64,128,256
  python -m offline.projection --benchmark deepcam --machine machines/eos-h100.yaml --nodes 64,128,256 \\
         --global-batch 2048 --staging untimed
  python -m offline.projection --validate            # docs/scaling.md's table: projection vs published results
  python -m offline.projection --calibrate perlmutter-cosmoflow-128   # the efficiency a published point implies

For each node count it prints the global and local batch, the epochs to converge from
mlperf_logging's RCP table for that global batch ("no RCP" outside the table), the staging time,
the step time from the roofline (compute or memory bound) plus the ring allreduce, the
evaluation time per epoch, the input pipeline's headroom and the projected time to train; then
where the time goes, from which node count staging from the shared file system dominates, and
what local batch keeps a device busy. It writes a PNG of the curves with the published points
of that machine and benchmark. The model and its assumptions: offline/projection/model.py.

Flags:
  --benchmark NAME        a benchmark of common/benchmarks.py
  --machine YAML          a machine description (machines/*.yaml)
  --nodes N,N,...         node counts to project
  --global-batch G        a fixed global batch (strong scaling); the local batch is G / devices
  --local-batch B         a fixed local batch (the global batch grows with the nodes); default: the
                          local batch of most of the benchmark's closed configs
  --precision P           fp32, tf32, fp16 or bf16 (default: the machine file's)
  --characterization DIR  take FLOPs, traffic, gradient bytes and input rate from a run's
                          characterization.json (offline.characterize) instead of the stored
                          full-size measurements (offline/model_costs/<benchmark>.json)
  --instances M           M jobs staging at once share the file system (weak scaling)
  --staging timed|untimed whether staging counts in the time to train (default timed, as the
                          MLPerf HPC rules read here; NVIDIA's v3.0 Eos runs staged during init)
  --rcp-pass full|pruned  the RCP table as measured, or pruned as the RCP checker prunes it
  --ruleset R             mlperf_logging's hpc ruleset for the RCP table (default 3.0.0)
  --busy F                the device-busy fraction the local-batch answer aims at (default 0.9)
  --png PATH              where the figure goes (default runs/projection/<benchmark>_<machine>.png)
  --spatial-ranks K       each sample split across K consecutive devices along the axis of its
                          benchmark's spatial_split in common/benchmarks.py (cosmoflow: depth,
                          offline/projection/spatial.py; deepcam: height, height_split.py), K a
                          divisor of a node's devices (one node) or a multiple of them (K / devices
                          per node whole nodes, the halos between them over the NIC); prints the
                          split's collectives per layer, which slab boundaries cross the network,
                          memory per device against the machine's, K=1 beside K and where the split
                          pays (default 1: the projection above, unchanged)
  --sample-edge N         the depth split: 128 (default), 256 or 512 (analytic scaling of the 128^3 costs)
  --cycle-time-ms T       the split's latency per collective (default 1: Horovod's cycle time)
"""

import argparse

from common import benchmarks
from common.cli import tool_main
from common.errors import InputError
from offline.projection import (
    height_report,
    height_split,
    inputs,
    model,
    plots,
    published_points,
    questions,
    rcp,
    report,
    spatial,
    spatial_report,
)
from offline.projection.request import Request

# The projection of each split axis of common/benchmarks.py's spatial_split.
SPLIT_PROJECTIONS = {
    spatial.AXIS: spatial_report.run_spatial_projection,
    height_split.AXIS: height_report.run_height_projection,
}


def run_projection(args) -> int:
    """The data-parallel projection: the table, the answers, the figure."""
    machine = inputs.load_machine(args.machine)
    precision = args.precision or machine.precision
    machine.peak(precision)
    costs, costs_line = inputs.load_costs(args.benchmark, args.characterization)
    means = rcp.rcp_means(args.benchmark, args.ruleset, args.rcp_pass)
    if args.staging == "timed":
        inputs.check_staging_rates(args.machine, machine, inputs.DATASETS[args.benchmark])
    request = Request(
        args.benchmark,
        machine,
        inputs.parse_nodes(args.nodes),
        args.global_batch,
        args.local_batch or inputs.default_local_batch(args.benchmark),
        precision,
        args.instances,
        args.staging == "timed",
        means,
    )
    rows = request.rows(costs)
    print(report.format_projections(request, costs, costs_line, rows, report.rcp_line(args, means)))
    print()
    print("\n".join(questions.answers(request, costs, args.busy)))
    machine_stem = inputs.machine_path(args.machine).stem
    png = args.png or inputs.REPO / "runs" / "projection" / f"{args.benchmark}_{machine_stem}.png"
    plots.plot(request, rows, costs_line, png)
    print(f"wrote {png}")
    return 0


@tool_main(KeyError, ValueError)
def main(argv=None) -> int:
    """Returns 0, or 2 (ExitCode.INPUT_ERROR) after one `error: ...` line on stderr."""
    parser = argparse.ArgumentParser(
        prog="python -m offline.projection",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--benchmark", choices=benchmarks.names())
    parser.add_argument("--machine", help="machines/*.yaml (a path or a name of machines/)")
    parser.add_argument("--nodes", help="node counts, comma-separated")
    batch = parser.add_mutually_exclusive_group()
    batch.add_argument("--global-batch", type=int)
    batch.add_argument("--local-batch", type=int)
    parser.add_argument("--precision", choices=sorted(model.ELEMENT_BYTES))
    parser.add_argument("--characterization", metavar="RUN_DIR")
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--staging", choices=("timed", "untimed"), default="timed")
    parser.add_argument("--rcp-pass", choices=("full", "pruned"), default="full")
    parser.add_argument("--ruleset", default="3.0.0")
    parser.add_argument("--busy", type=float, default=0.9)
    parser.add_argument("--png")
    splits = ", ".join(
        f"{b.name}: {b.spatial_split}" for b in benchmarks.BENCHMARKS if b.spatial_split
    )
    parser.add_argument(
        "--spatial-ranks",
        type=int,
        default=1,
        metavar="K",
        help=f"split each sample across K consecutive devices ({splits}; K a divisor or a "
        f"multiple of a node's devices)",
    )
    parser.add_argument(
        "--sample-edge",
        type=int,
        default=128,
        choices=spatial.EDGES,
        help=f"{spatial.BENCHMARK}: the sample's edge N (N^3 x 4 volumes)",
    )
    parser.add_argument(
        "--cycle-time-ms",
        type=float,
        default=spatial.HOROVOD_CYCLE_S * 1e3,
        help="per-collective latency of the split layers (Horovod's cycle time)",
    )
    parser.add_argument(
        "--validate", action="store_true", help="print the validation table and exit"
    )
    parser.add_argument(
        "--calibrate", metavar="POINT", help="print the efficiency a published point implies"
    )
    args = parser.parse_args(argv)
    if args.validate:
        return published_points.run_validation(args.ruleset)
    if args.calibrate:
        print(f"{published_points.calibrate(args.calibrate):.4f}")
        return 0
    if not (args.benchmark and args.machine and args.nodes):
        parser.error("--benchmark, --machine and --nodes are needed (or --validate / --calibrate)")
    if (
        args.instances < 1
        or (args.global_batch is not None and args.global_batch < 1)
        or (args.local_batch is not None and args.local_batch < 1)
    ):
        raise InputError("--instances, --global-batch and --local-batch must be at least 1")
    if args.spatial_ranks != 1 or args.sample_edge != spatial.MEASURED_EDGE:
        axis = benchmarks.get(args.benchmark).spatial_split
        if args.sample_edge != spatial.MEASURED_EDGE and axis != spatial.AXIS:
            raise InputError(
                f"--sample-edge is for {spatial.BENCHMARK} only (the {spatial.AXIS} split), "
                f"not {args.benchmark}"
            )
        if axis not in SPLIT_PROJECTIONS:
            raise InputError(
                f"--spatial-ranks: {args.benchmark} does not split its samples "
                f"(no spatial_split in common/benchmarks.py)"
            )
        return SPLIT_PROJECTIONS[axis](args)
    return run_projection(args)
