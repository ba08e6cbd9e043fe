"""--spatial-ranks K and --sample-edge N: CosmoFlow split K ways, next to K = 1, as a person reads it.

The collectives and memory tables, the verdicts (where splitting loses, wins, or is the only
way) and the run that prints them; the model itself is spatial.py.
"""

import dataclasses

from common.errors import InputError
from offline.projection import inputs, plots, rcp, report, spatial
from offline.projection.model import Machine, ModelCosts, Projection
from offline.projection.request import Request


def gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB"


def spatial_requests(
    args, machine: Machine, precision: str, means: dict, measured: ModelCosts
) -> tuple:
    """((K=1 request, its costs), (K-way request, its costs)) at the sample edge asked for.

    Away from 128^3 there is no RCP (the table is the 128^3 benchmark's) and no data set: the
    epoch is one of a hypothetical data set with the 128^3 one's sample counts, its bytes scaled.
    """
    edge, k = args.sample_edge, args.spatial_ranks
    dataset = inputs.DATASETS[spatial.BENCHMARK]
    if edge != spatial.MEASURED_EDGE:
        means = {}
        dataset = dataclasses.replace(
            dataset, bytes=dataset.bytes * (edge / spatial.MEASURED_EDGE) ** 3
        )
    cycle_s = args.cycle_time_ms / 1e3

    def request(ranks):
        exchange = (
            (lambda b: spatial.exchange_seconds(machine, edge, ranks, precision, b, cycle_s))
            if ranks > 1
            else None
        )
        return (
            Request(
                spatial.BENCHMARK,
                machine,
                inputs.parse_nodes(args.nodes),
                args.global_batch,
                args.local_batch or inputs.default_local_batch(spatial.BENCHMARK),
                precision,
                args.instances,
                args.staging == "timed",
                means,
                ranks,
                exchange,
                dataset,
                spatial.memory_per_device(edge, ranks, precision),
            ),
            spatial.device_costs(measured, edge, ranks),
        )

    return request(1), request(k)


def collectives_table(
    machine: Machine, edge: int, k: int, precision: str, cycle_s: float
) -> list[str]:
    """Per split layer: what a rank sends (halo) or receives (gather) per sample, and its time."""
    links = spatial.group_links(machine, k)
    over = (
        [f"over the intra-node link at {links.intra_bytes_per_s / 1e9:.0f} GB/s"]
        if links.devices_per_node > 1
        else []
    )
    lines = [
        f"the split layers' collectives per rank, per sample of a group's local batch, {precision} "
        f"({spatial.ELEMENT_BYTES[precision]} bytes), "
        + "; ".join(over + network_lines(links))
        + ":",
        f"{'layer':>22} {'kind':>6} {'slab in (Zs,Y,X,C)':>20} {'forward':>10} {'backward':>10} "
        f"{'transfer':>10} {'collectives':>11} {'latency':>9}",
    ]
    entries = [(c, 1) for c in spatial.collectives(edge, k, precision)]
    for c, _ in entries:
        lines.append(
            f"{c.layer:>22} {c.what:>6} {'x'.join(map(str, c.slab)):>20} {collective_cells(c, links, cycle_s)}"
        )
    lines.append(f"{'total':>22} {'':>6} {'':>20} {total_cells(entries, links, cycle_s)}")
    lines.append(
        f"latency: ASSUMPTION, at most one Horovod cycle ({cycle_s * 1e3:g} ms, HOROVOD_CYCLE_TIME's default "
        f"since Horovod 0.21.0) of waiting per collective issued serially"
        + (
            f", plus the NIC's {links.network_latency_s * 1e6:g} us per message between nodes (1 per halo "
            f"alltoall, {4 * (k - 1)} for the gather's rings)"
            if links.nodes > 1
            else ""
        )
        + f"; halo bytes = 2 halos x h={spatial.KERNEL // 2} plane x Y x X x Cin x element bytes"
    )
    return lines


def collective_cells(c: spatial.Collective, links: spatial.GroupLinks, cycle_s: float) -> str:
    """A collective's bytes forward and backward per sample, its transfer at one sample, its count and latency."""
    return (
        f"{c.forward_bytes / 1e6:>7.3f} MB {c.backward_bytes / 1e6:>7.3f} MB {c.transfer_s(links, 1) * 1e6:>7.1f} us "
        f"{c.count:>11} {c.latency_s(links, cycle_s) * 1e3:>6.1f} ms"
    )


def total_cells(entries: list, links: spatial.GroupLinks, cycle_s: float) -> str:
    """The total line's cells over (collective, times it runs in a step) pairs, at one sample per group."""
    nbytes = sum(n * (c.forward_bytes + c.backward_bytes) for c, n in entries)
    transfer = sum(n * c.transfer_s(links, 1) for c, n in entries)
    latency = sum(n * c.latency_s(links, cycle_s) for c, n in entries)
    return (
        f"{'':>10} {nbytes / 1e6:>7.3f} MB {transfer * 1e6:>7.1f} us {'':>11} {latency * 1e3:>6.1f} ms  "
        f"(forward + backward)"
    )


def network_lines(links: spatial.GroupLinks) -> list[str]:
    """Which slab boundaries of a group join two nodes, and the link they cross (none on one node)."""
    if links.nodes == 1:
        return []
    crossing = links.crossing_boundaries()
    which = (
        "all of them"
        if len(crossing) == links.spatial_ranks - 1
        else "slabs " + ", ".join(f"{b - 1}|{b}" for b in crossing) + ", numbered from 0"
    )
    return [
        f"a group of {links.spatial_ranks} devices spans {links.nodes} nodes: {len(crossing)} of its "
        f"{links.spatial_ranks - 1} slab boundaries ({which}) cross the network, each at the device's share "
        f"of the NIC, {links.network_bytes_per_s / 1e9:g} GB/s"
    ]


def memory_table(machine: Machine, k: int, precision: str) -> list[str]:
    """Memory per device at local batch 1, each edge, K = 1 and K, against the device's memory."""
    device = machine.device_memory_bytes
    lines = [
        memory_title(precision, "momentum (K=1: nothing split, all of it replicated)", device),
        f"{'sample':>7} {'K':>3} {'split/K':>10} {'halo':>10} {'replicated':>10} {'backward':>10} {'state':>9} "
        f"{'total':>10} {'fp32 total':>11} {'fits':>5}",
    ]
    for edge in spatial.EDGES:
        for ranks in sorted({1, k}):
            m = spatial.memory_per_device(edge, ranks, precision)
            fp32 = spatial.memory_per_device(edge, ranks, "fp32")
            fits = "-" if device is None else ("yes" if m.fits(device) else "NO")
            lines.append(f"{edge:>5}^3 {ranks:>3} {memory_cells(m, fp32)} {fits:>5}")
    return lines


def memory_title(precision: str, state: str, device: float | None) -> str:
    return (
        f"memory per device, local batch 1 (one sample per group), {precision} activations, float32 weights + "
        f"gradients + {state}; device memory {gb(device) if device else 'unknown (no device_memory_bytes)'}:"
    )


def memory_cells(m: spatial.Memory, fp32: spatial.Memory) -> str:
    """A memory row's parts at local batch 1, its total, and the total in fp32."""
    return (
        f"{gb(m.split_activations):>10} {gb(m.halo_copies):>10} {gb(m.head_activations):>10} "
        f"{gb(m.backward_working):>10} {gb(m.state):>9} {gb(m.total):>10} {gb(fp32.total):>11}"
    )


def spatial_verdicts(args, precision: str, base: tuple, split_rows: list) -> list[str]:
    """Where splitting loses, where it wins, and where it is the only way.

    A split run on N nodes is set against the K=1 run on N / K nodes: the same number of groups
    (data-parallel replicas) at the same local batch, so the split's gain is its device time / K
    and its cost the collectives. At equal node counts the devices would do the same work.
    `base`: (the K=1 request, its costs).
    """
    k, machine, out = args.spatial_ranks, base[0].machine, []
    device = machine.device_memory_bytes
    for e in spatial.EDGES if device else ():
        one = spatial.memory_per_device(e, 1, precision)
        many = spatial.memory_per_device(e, k, precision)
        if not one.fits(device):
            out.append(
                f"{e}^3: one sample needs {gb(one.total)} on one device ({precision}), more than its "
                f"{gb(device)}: splitting is the only way; K={k} needs {gb(many.total)} "
                + ("(fits)" if many.fits(device) else "(does not fit either: a larger K)")
            )
    out += node_verdicts(k, base, split_rows)
    collectives = spatial.collectives(args.sample_edge, k, precision)
    latency_ms = sum(c.count for c in collectives) * args.cycle_time_ms
    out.append(
        f"a split step waits on {sum(c.count for c in collectives)} collectives, ~{latency_ms:g} ms of latency "
        f"whatever the batch (the assumed cycle): splitting pays where the device time it saves exceeds "
        f"that, or where K=1 cannot run at all"
    )
    return out


def node_verdicts(k: int, base: tuple, split_rows: list) -> list[str]:
    """Each split row against K=1 on N / K nodes (the same groups at the same local batch), the rows
    past the data-parallel limit, and the fastest of each. `base`: (the K=1 request, its costs)."""
    base_request, base_costs = base
    out = []
    for p in (p for p in split_rows if not isinstance(p, str)):
        if p.nodes % k:
            continue
        try:
            b = base_request.project(base_costs, p.nodes // k)
        except ValueError as e:
            out.append(
                f"{p.nodes} nodes at K={k} ({_span(p)}) vs {p.nodes // k} at K=1: the latter {e}"
            )
            continue
        verdict = "splitting loses" if p.step_s > b.step_s else "splitting wins"
        out.append(
            f"{p.nodes} nodes at K={k} vs {b.nodes} at K=1 ({p.groups} replicas of local batch "
            f"{p.local_batch:g}): {verdict}: step {p.step_s * 1e3:.1f} vs {b.step_s * 1e3:.1f} ms (device time "
            f"{b.device_step_s * 1e3:.1f} -> {p.device_step_s * 1e3:.1f} ms, collectives "
            f"+{p.exchange_s * 1e3:.1f} ms), {_span(p)} vs {_span(b)}"
        )
    beyond = [p for p in split_rows if not isinstance(p, str) and p.global_batch < p.devices]
    if beyond:
        out.append(
            "past the data-parallel limit (fewer samples than devices) only the split runs: "
            + ", ".join(f"{p.nodes} nodes {_span(p)}" for p in beyond)
        )
    fastest = [
        min(
            (p for p in rows if not isinstance(p, str)),
            key=lambda p: p.time_to_train_s or p.epoch_s,
            default=None,
        )
        for rows in (base_request.rows(base_costs), split_rows)
    ]
    out.append(
        "fastest of the node counts asked: "
        + "; ".join(
            f"K={ranks} {_span(p)} on {p.nodes} nodes"
            for ranks, p in zip((1, k), fastest)
            if p is not None
        )
    )
    return out


def print_projections(args, base: tuple, split: tuple, costs_line: str, split_title: str) -> dict:
    """Prints the K=1 projection and, for K > 1, the split one; returns their rows by K.
    `base`, `split`: (request, its costs)."""
    rows = {}
    for (request, costs), title in ((base, "data parallel only (K=1)"), (split, split_title)):
        if request is split[0] and request.spatial_ranks == 1:
            break
        rows[request.spatial_ranks] = request.rows(costs)
        print(f"\n{title}:")
        epochs_line = (
            report.rcp_line(args, request.means) if request.means else "none (no RCP at this size)"
        )
        print(
            report.format_projections(
                request, costs, costs_line, rows[request.spatial_ranks], epochs_line
            )
        )
    return rows


def _span(p: Projection) -> str:
    """The time to train, or the epoch's time where no RCP gives epochs."""
    return (
        report.minutes(p.time_to_train_s)
        if p.epochs is not None
        else f"{p.epoch_s / 60:.2f} min/epoch"
    )


def run_spatial_projection(args) -> int:
    """--spatial-ranks K and/or --sample-edge N: CosmoFlow split K ways, next to K = 1."""
    machine = inputs.load_machine(args.machine)
    precision = args.precision or machine.precision
    machine.peak(precision)
    edge, k = args.sample_edge, args.spatial_ranks
    spatial.check_split(machine, edge, k)
    if args.characterization:
        raise InputError(
            "--characterization projects the unsplit 128^3 model only "
            "(drop --spatial-ranks/--sample-edge)"
        )
    measured, measured_line = inputs.load_costs(spatial.BENCHMARK)
    costs_line = f"{edge}^3, scaled analytically by the layer shapes from the {measured_line}"
    means = rcp.rcp_means(spatial.BENCHMARK, args.ruleset, args.rcp_pass)
    (base, base_costs), (split, split_costs) = spatial_requests(
        args, machine, precision, means, measured
    )
    if split.staging_timed:
        inputs.check_staging_rates(args.machine, machine, split.dataset)
    layers = spatial.network_layers(edge, k)
    gather = next((layer.name for layer in layers if layer.kind == "gather"), "none (K=1)")
    filters = [layer.out_shape[-1] for layer in layers if layer.kind == "conv"]
    print(
        f"{spatial.BENCHMARK} at {edge}^3 split {k} ways along depth (z) on {machine.name}, machine file "
        f"{inputs.machine_path(args.machine)}"
    )
    print(
        f"model: {len(filters)} conv layers of {', '.join(map(str, filters))} filters, "
        f"{spatial.parameters(layers):,} parameters; slabs of {edge // k} planes, gathered at {gather}"
    )
    print(
        f"FLOPs and bytes: ANALYTIC SCALING of the 128^3 measurement ({measured_line}) by the layer shapes: "
        f"2 k^3 Cin Cout N^3 per conv forward, x3 for training, the split layers' / K on each device plus "
        f"the replicated head"
    )
    if edge != spatial.MEASURED_EDGE:
        print(
            f"no RCP at {edge}^3 (the table is the 128^3 benchmark's): epochs of a hypothetical data set of "
            f"{split.dataset.train_samples:,} samples ({split.dataset.bytes / 1e12:.0f} TB), no time to train"
        )
    print()
    if k > 1:
        print("\n".join(collectives_table(machine, edge, k, precision, args.cycle_time_ms / 1e3)))
        print()
    print("\n".join(memory_table(machine, k, precision)))
    rows = print_projections(
        args,
        (base, base_costs),
        (split, split_costs),
        costs_line,
        f"{k}-way spatial x data parallel",
    )
    print()
    print("\n".join(spatial_verdicts(args, precision, (base, base_costs), rows.get(k, []))))
    machine_stem = inputs.machine_path(args.machine).stem
    png = (
        args.png
        or inputs.REPO
        / "runs"
        / "projection"
        / f"{spatial.BENCHMARK}_{edge}_k{k}_{machine_stem}.png"
    )
    plots.plot_spatial(machine, args, precision, rows, costs_line, png)
    print(f"wrote {png}")
    return 0
