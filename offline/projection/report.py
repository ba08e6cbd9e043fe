"""The projection as a person reads it: the table of every term per node count."""

from offline.projection import model
from offline.projection.model import ModelCosts
from offline.projection.request import Request


def minutes(seconds) -> str:
    """Seconds as minutes, "-" for none."""
    return "-" if seconds is None else f"{seconds / 60:.2f} min"


def format_projections(
    request: Request, costs: ModelCosts, costs_line: str, rows: list, rcp_line: str
) -> str:
    """The table of every term per node count, then where the time goes."""
    m, split = request.machine, request.spatial_ranks > 1
    lines = [
        f"{request.benchmark} on {m.name}: {request.precision}, efficiency "
        f"{m.efficiency_for(request.benchmark):.3f}, staging {'timed' if request.staging_timed else 'untimed'}"
        + (f", {request.instances} jobs sharing the file system" if request.instances > 1 else ""),
        f"model: {costs.flops_train / 1e9:.1f} GFLOP and "
        f"{costs.activation_bytes_train * model.ELEMENT_BYTES[request.precision] / 4 / 1e9:.2f} GB of "
        f"activation traffic per training sample"
        + (
            f" and device (its 1/{request.spatial_ranks} of the split layers, the replicated head)"
            if split
            else ""
        )
        + f"; {costs_line}",
        f"epochs: {rcp_line}",
        "",
    ]
    step_header = "step: device + exchange + allreduce" if split else "step: device + allreduce"
    width = 37 if split else 26
    header = (
        f"{'nodes':>6} {'devices':>7} {'global':>7} {'local':>6} {'epochs':>7} {'staging':>9} "
        f"{step_header:>{width}} {'bound':>7} {'eval/epoch':>10} {'headroom':>8} {'time to train':>14}"
    )
    lines.append(header)
    for p in rows:
        if isinstance(p, str):
            lines.append(p)
            continue
        epochs = f"{p.epochs:7.2f}" if p.epochs is not None else f"{'no RCP':>7}"
        staging = "-" if p.staging_s is None else f"{p.staging_s:.1f} s"
        headroom = "-" if p.input_headroom is None else f"{p.input_headroom:.2f}"
        step = (
            f"{p.device_step_s * 1e3:.1f} + "
            + (f"{p.exchange_s * 1e3:.1f} + " if split else "")
            + f"{p.visible_allreduce_s * 1e3:.1f} ms"
        )
        lines.append(
            f"{p.nodes:>6} {p.devices:>7} {p.global_batch:>7} {p.local_batch:>6g} {epochs} {staging:>9} "
            f"{step:>{width}} {p.bound:>7} {p.eval_epoch_s:>8.2f} s {headroom:>8} "
            f"{minutes(p.time_to_train_s):>14}"
        )
    components = model.COMPONENTS + (("exchange",) if split else ())
    lines += [
        "",
        "where the time goes (share of the time to train):",
        f"{'nodes':>6} " + " ".join(f"{c:>9}" for c in components),
    ]
    for p in rows:
        if isinstance(p, str) or p.shares() is None:
            continue
        lines.append(f"{p.nodes:>6} " + " ".join(f"{p.shares()[c]:>9.0%}" for c in components))
    return "\n".join(lines)


def rcp_line(args, means: dict) -> str:
    """Where the epochs come from, and the table's mean epochs per global batch."""
    return (
        f"mlperf_logging hpc {args.ruleset} rcps_{args.benchmark}.json, {args.rcp_pass} table, mean epochs "
        + ", ".join(f"{bs}: {e:.2f}" for bs, e in means.items())
        + "; linear between batch sizes, none outside"
    )
