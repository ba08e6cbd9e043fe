"""--spatial-ranks K for the benchmark split along height (DeepCAM), next to K = 1, as a person reads it.

The collectives table (a row per layer that adds a collective, the middle flow's identical blocks
as one row), memory per device, the two projections, where the split pays and where it loses (the
rows against K=1 on N / K nodes, and per K of the machine the local batch from which the device
time saved exceeds the collectives added); the model itself is height_split.py.
"""

import dataclasses
import re

from common.errors import InputError
from common.parallel import cycle_time
from offline.projection import height_split, inputs, model, rcp, spatial, spatial_report
from offline.projection.model import Machine, ModelCosts
from offline.projection.request import Request

MIDDLE_FLOW = re.compile(r"\.block(\d+)[._]")
MIDDLE_RANGE = range(4, 4 + height_split.MIDDLE_BLOCKS)
MIDDLE_NAME = f".block{MIDDLE_RANGE[0]}-{MIDDLE_RANGE[-1]}"
LARGEST_BATCH = 64  # the break-even search stops here (or where a group's batch no longer fits)


def collapsed(collectives: list) -> list[tuple]:
    """(collective, times in the step): the middle flow's blocks, identical, as block4-19 once."""
    rows, seen = [], {}
    for c in collectives:
        m = MIDDLE_FLOW.search(c.layer)
        if m and int(m.group(1)) in MIDDLE_RANGE:
            name = c.layer[: m.start()] + MIDDLE_NAME + c.layer[m.end() - 1 :]
            if name in seen:
                seen[name][1] += 1
                continue
            seen[name] = [dataclasses.replace(c, layer=name), 1]
            rows.append(seen[name])
        else:
            rows.append([c, 1])
    return [tuple(r) for r in rows]


def collectives_table(machine: Machine, k: int, precision: str, cycle_s: float) -> list[str]:
    """Per layer that adds a collective: what a rank sends or receives per sample, and its time."""
    links = spatial.group_links(machine, k)
    over = (
        [f"over the intra-node link at {links.intra_bytes_per_s / 1e9:.0f} GB/s"]
        if links.devices_per_node > 1
        else []
    )
    lines = [
        f"the split's collectives per rank, per sample of a group's local batch (batch norm's and the loss's per "
        f"step), {precision} ({spatial.ELEMENT_BYTES[precision]} bytes), "
        + "; ".join(over + spatial_report.network_lines(links))
        + ":",
        f"{'layer':>48} {'kind':>9} {'rows':>4} {'x':>3} {'slab in (Hs,W,C)':>16} {'forward':>10} {'backward':>10} "
        f"{'transfer':>10} {'collectives':>11} {'latency':>9}",
    ]
    entries = collapsed(height_split.collectives(k, precision))
    halos = {
        layer.name.replace(f".block{MIDDLE_RANGE[0]}.", f"{MIDDLE_NAME}."): layer.halo
        for layer in height_split.network_layers(k)
    }
    for c, n in entries:
        rows = halos[c.layer] if c.what == "halo" else ""
        lines.append(
            f"{c.layer:>48} {c.what:>9} {rows:>4} {n:>3} {'x'.join(map(str, c.slab)):>16} "
            f"{spatial_report.collective_cells(c, links, cycle_s)}"
        )
    lines.append(
        f"{'total':>48} {'':>9} {'':>4} {'':>3} {'':>16} {spatial_report.total_cells(entries, links, cycle_s)}"
    )
    lines.append(
        cycle_line(cycle_s)
        + (
            f"; plus the NIC's {links.network_latency_s * 1e6:g} us per message between "
            f"nodes (1 per halo alltoall, 2 (K-1) per ring)"
            if links.nodes > 1
            else ""
        )
        + "; halo bytes = 2 x rows x W x Cin x element bytes (rows: max(above, below), the symmetric exchange)"
    )
    return lines


def cycle_line(cycle_s: float) -> str:
    return (
        f"latency: ASSUMPTION, at most one Horovod cycle ({cycle_s * 1e3:g} ms) of waiting per collective issued "
        f"serially (HOROVOD_CYCLE_TIME: Horovod's default {cycle_time.DEFAULT_MS:g} ms; train.py sets "
        f"{cycle_time.BATCHNORM_GROUP_MS:g} ms for a height split, whose batch norm sums over the spatial "
        f"group, unless HOROVOD_CYCLE_TIME is set: --cycle-time-ms {cycle_time.BATCHNORM_GROUP_MS:g})"
    )


def memory_table(machine: Machine, k: int, precision: str) -> list[str]:
    """Memory per device at local batch 1, K = 1 and K, against the device's memory."""
    device = machine.device_memory_bytes
    lines = [
        spatial_report.memory_title(precision, "LAMB's two slots, replicated", device),
        f"{'K':>3} {'rows':>5} {'layers/K':>10} {'halo':>10} {'gathered':>10} {'backward':>10} {'state':>9} "
        f"{'total':>10} {'fp32 total':>11} {'samples that fit':>17}",
    ]
    for ranks in sorted({1, k}):
        m = height_split.memory_per_device(ranks, precision)
        fp32 = height_split.memory_per_device(ranks, "fp32")
        fit = "-" if device is None else str(samples_that_fit(m, device))
        lines.append(
            f"{ranks:>3} {height_split.HEIGHT // ranks:>5} {spatial_report.memory_cells(m, fp32)} {fit:>17}"
        )
    return lines


def samples_that_fit(memory: spatial.Memory, device_bytes: float) -> int:
    """The largest local batch per group whose memory fits one device (0: not even one sample)."""
    per_sample = memory.total_at(1) - memory.state
    return max(0, int((device_bytes - memory.state) // per_sample))


def break_even(
    machine: Machine, measured: ModelCosts, k: int, precision: str, cycle_s: float
) -> tuple:
    """(local batch per group from which K's device step + collectives beat K=1's device step at the same
    batch, or None up to LARGEST_BATCH or the largest that fits; the device time saved and the
    collectives at one sample). The gradient allreduce, over K x the devices split, is left aside."""
    base, split = height_split.device_costs(measured, 1), height_split.device_costs(measured, k)

    def step(costs, b):
        return model.device_step_seconds(machine, costs, b, precision, height_split.BENCHMARK)

    saved = step(base, 1) - step(split, 1)
    added = height_split.exchange_seconds(machine, k, precision, 1, cycle_s)
    for b in range(1, most_batch(machine, k, precision) + 1):
        if step(split, b) + height_split.exchange_seconds(machine, k, precision, b, cycle_s) < step(
            base, b
        ):
            return b, saved, added
    return None, saved, added


def per_k_lines(
    machine: Machine, measured: ModelCosts, precision: str, cycle_s: float
) -> list[str]:
    """Per K the machine can group: its link, collectives, and the batch from which the split pays."""
    lines = [
        f"per K on {machine.name} ({precision}, cycle {cycle_s * 1e3:g} ms): the device time one sample's split saves "
        f"against the collectives it adds, and the local batch per group from which the split's step is the "
        f"shorter (gradient allreduce aside; memory: the largest batch that fits):",
        f"{'K':>3} {'group':>12} {'collectives':>11} {'latency':>9} {'transfer':>9} {'saved/sample':>12} "
        f"{'pays from':>20}",
    ]
    for k in height_split.valid_ranks():
        try:
            links = spatial.group_links(machine, k)
        except InputError:
            continue  # neither a divisor nor a multiple of a node's devices
        cs = height_split.collectives(k, precision)
        b, saved, added = break_even(machine, measured, k, precision, cycle_s)
        transfer = sum(c.transfer_s(links, 1) for c in cs)
        group = "on one node" if links.nodes == 1 else f"over {links.nodes} nodes"
        pays = f"local batch {b}" if b else f"never (to {most_batch(machine, k, precision)})"
        lines.append(
            f"{k:>3} {group:>12} {sum(c.count for c in cs):>11} {(added - transfer) * 1e3:>6.1f} ms "
            f"{transfer * 1e3:>6.2f} ms {saved * 1e3:>9.1f} ms {pays:>20}"
        )
    return lines


def most_batch(machine: Machine, k: int, precision: str) -> int:
    """The largest local batch per group the break-even search tries: LARGEST_BATCH, or what fits."""
    device = machine.device_memory_bytes
    fit = (
        samples_that_fit(height_split.memory_per_device(k, precision), device)
        if device
        else LARGEST_BATCH
    )
    return min(LARGEST_BATCH, fit)


def run_height_projection(args) -> int:
    """--spatial-ranks K: the benchmark split along height K ways, next to K = 1."""
    machine = inputs.load_machine(args.machine)
    precision = args.precision or machine.precision
    machine.peak(precision)
    k = args.spatial_ranks
    height_split.check_split(machine, k)
    if args.characterization or args.png:
        raise InputError(
            "--characterization and --png: the height split projects the stored model's costs and "
            "draws no figure (drop them, or --spatial-ranks)"
        )
    name = height_split.BENCHMARK
    measured, measured_line = inputs.load_costs(name)
    costs_line = f"scaled analytically by the layer shapes from the {measured_line}"
    means = rcp.rcp_means(name, args.ruleset, args.rcp_pass)
    cycle_s = args.cycle_time_ms / 1e3
    if args.staging == "timed":
        inputs.check_staging_rates(args.machine, machine, inputs.DATASETS[name])

    def request(ranks):
        exchange = (
            (lambda b: height_split.exchange_seconds(machine, ranks, precision, b, cycle_s))
            if ranks > 1
            else None
        )
        return (
            Request(
                name,
                machine,
                inputs.parse_nodes(args.nodes),
                args.global_batch,
                args.local_batch or inputs.default_local_batch(name),
                precision,
                args.instances,
                args.staging == "timed",
                means,
                ranks,
                exchange,
                None,
                height_split.memory_per_device(ranks, precision),
            ),
            height_split.device_costs(measured, ranks),
        )

    layers = height_split.network_layers(k)
    gathered = [layer.name.removesuffix("_gather") for layer in layers if layer.kind == "gather"]
    print(
        f"{name} at {height_split.HEIGHT}x{height_split.WIDTH}x{height_split.IN_CHANNELS} split {k} ways along "
        f"height on {machine.name}, machine file {inputs.machine_path(args.machine)}"
    )
    print(
        f"model: {spatial.parameters(layers):,} parameters, {sum(1 for layer in layers if layer.halo)} layers reading "
        f"rows beyond their slab (kernel 3), {sum(layer.kind == 'bn' for layer in layers)} batch-norm layers; slabs of "
        f"{height_split.HEIGHT // k} rows ({height_split.HEIGHT // k // height_split.OUTPUT_STRIDE} at stride "
        f"{height_split.OUTPUT_STRIDE}); gathered maps: {', '.join(gathered) or 'none'}"
    )
    print(
        f"FLOPs and bytes: ANALYTIC SCALING of the measurement ({measured_line}) by the layer shapes: every layer's "
        f"/ K on each device, the gathered maps whole"
    )
    print()
    if k > 1:
        print("\n".join(collectives_table(machine, k, precision, cycle_s)))
        print()
    print("\n".join(memory_table(machine, k, precision)))
    base = request(1)
    rows = spatial_report.print_projections(
        args, base, request(k), costs_line, f"{k}-way spatial (height) x data parallel"
    )
    print()
    print("\n".join(per_k_lines(machine, measured, precision, cycle_s)))
    print()
    if k > 1:
        print("\n".join(spatial_report.node_verdicts(k, base, rows[k])))
        count = sum(c.count for c in height_split.collectives(k, precision))
        other = (
            cycle_time.BATCHNORM_GROUP_MS
            if args.cycle_time_ms != cycle_time.BATCHNORM_GROUP_MS
            else cycle_time.DEFAULT_MS
        )
        print(
            f"a split step waits on {count} collectives in sequence, ~{count * args.cycle_time_ms:g} ms of cycles "
            f"at {args.cycle_time_ms:g} ms (~{count * other:g} ms at {other:g} ms) whatever the batch: the split "
            f"pays where the device time it saves exceeds that, or where K=1 cannot run (fewer samples than "
            f"devices, or no room)"
        )
    return 0
