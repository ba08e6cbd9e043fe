"""The projection's figures: time to train against nodes, and (split runs) memory per device."""

from pathlib import Path

from offline.projection import inputs, model, spatial
from offline.projection.model import Machine
from offline.projection.request import Request


def plot(request: Request, rows: list, costs_line: str, path) -> None:
    """Time to train and its parts against nodes, with the published points of that machine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    projected = [p for p in rows if not isinstance(p, str) and p.time_to_train_s is not None]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    if projected:
        nodes = [p.nodes for p in projected]
        ax.plot(
            nodes,
            [p.time_to_train_s / 60 for p in projected],
            "o-",
            color="black",
            lw=2,
            label="time to train",
        )
        for component, style in zip(model.COMPONENTS, ("s--", "^--", "v--", "d--")):
            values = [p.parts_s()[component] / 60 for p in projected]
            if any(values):
                ax.plot(nodes, values, style, alpha=0.8, label=component)
    machine_stem = None
    for name, point in inputs.load_points().items():
        if (
            point["benchmark"] != request.benchmark
            or inputs.load_machine(point["machine"]).name != request.machine.name
        ):
            continue
        machine_stem = point["machine"]
        jobs = f", {point['instances']} jobs" if point["instances"] > 1 else ""
        ax.plot(
            [point["nodes"]],
            [point["published_minutes"]],
            "*",
            markersize=14,
            label=f"published: {name} ({point['role']}, batch {point['global_batch']}{jobs})",
        )
    _nodes_axes(ax, {p.nodes for p in projected})
    policy = (
        f"global batch {request.global_batch}"
        if request.global_batch
        else f"local batch {request.local_batch}"
    )
    ax.set_title(
        f"{request.benchmark} on {request.machine.name}\nprojected, {request.precision}, {policy}, "
        f"efficiency {request.machine.efficiency_for(request.benchmark):.3f}"
        + ("" if machine_stem else " (no published point of this machine)"),
        fontsize=10,
    )
    _save(fig, costs_line, path)


def _nodes_axes(ax, nodes) -> None:
    """Log-log minutes against nodes, the node counts as ticks."""
    import matplotlib.ticker

    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sorted(nodes))
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("nodes")
    ax.set_ylabel("minutes")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)


def _save(fig, costs_line: str, path) -> None:
    from offline.plots import save_figure

    fig.text(0.01, 0.01, f"FLOPs and bytes per sample: {costs_line}", fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)


def plot_spatial(machine: Machine, args, precision: str, rows: dict, costs_line: str, path) -> None:
    """Time to train (or per epoch, away from 128^3) against nodes for each K; memory per device per edge."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5))
    nodes = set()
    for k, projected in rows.items():
        projected = [p for p in projected if not isinstance(p, str)]
        nodes.update(p.nodes for p in projected)
        minutes = [(p.time_to_train_s or p.epoch_s) / 60 for p in projected]
        left.plot(
            [p.nodes for p in projected],
            minutes,
            "o-" if k == 1 else "s-",
            lw=2,
            label=f"K={k}"
            + (" (data parallel only)" if k == 1 else f" ({k}-way spatial)")
            + ("" if projected else ": no node count fits or runs"),
        )
    _nodes_axes(left, nodes)
    what = "time to train" if args.sample_edge == spatial.MEASURED_EDGE else "minutes per epoch"
    policy = f"global batch {args.global_batch}" if args.global_batch else "local batch per group"
    left.set_title(
        f"{spatial.BENCHMARK} {args.sample_edge}^3 on {machine.name}: {what}, {policy}, {precision}",
        fontsize=9,
    )
    ks = sorted(rows)
    width = 0.8 / len(ks)
    for i, k in enumerate(ks):
        totals = [spatial.memory_per_device(e, k, precision).total / 1e9 for e in spatial.EDGES]
        right.bar([j + i * width for j in range(len(totals))], totals, width, label=f"K={k}")
    if machine.device_memory_bytes:
        right.axhline(
            machine.device_memory_bytes / 1e9, color="red", ls="--", label="device memory"
        )
    right.set_xticks([j + width * (len(ks) - 1) / 2 for j in range(len(spatial.EDGES))])
    right.set_xticklabels([f"{e}^3" for e in spatial.EDGES])
    right.set_yscale("log")
    right.set_ylabel("GB per device, local batch 1")
    right.set_title(f"memory per device ({precision} activations)", fontsize=9)
    right.legend(fontsize=8)
    right.grid(alpha=0.3, which="both", axis="y")
    _save(fig, costs_line, path)
