"""The questions users ask, answered by the same model: from which node count staging dominates,
what local batch keeps a device busy or compute-bound, whether the input pipeline keeps up."""

import math

from offline.projection import inputs, model, rcp
from offline.projection.model import Dataset, Machine, ModelCosts
from offline.projection.request import Request


def answers(request: Request, costs: ModelCosts, busy: float) -> list[str]:
    """The questions users ask, answered by the same model."""
    m, bench, out = request.machine, request.benchmark, []
    if model.staging_seconds(m, inputs.DATASETS[bench], 1) is None:
        out.append(
            "staging: the machine file states neither a file-system nor a node-local bandwidth"
        )
        return out + _batch_answers(request, costs, busy)
    saturation = model.staging_saturation_nodes(m, request.instances)
    if saturation is not None:
        out.append(
            f"staging: the shared file system ({m.filesystem_bytes_per_s / 1e12:.2f} TB/s"
            + (f" / {request.instances} jobs" if request.instances > 1 else "")
            + f") limits it beyond {saturation:,.0f} nodes ({m.node_local_write_bytes_per_s / 1e9:.2f} GB/s "
            f"per node below that)"
        )
    else:
        out.append(
            "staging: the file system's bandwidth is not in the machine file, so the nodes alone limit it"
        )
    dominates, checked = staging_dominates_from(
        m,
        costs,
        inputs.DATASETS[bench],
        bench,
        request.global_batch_for,
        lambda batch: rcp.rcp_epochs(request.means, batch),
        request.precision,
        request.instances,
    )
    policy = (
        f"global batch {request.global_batch}"
        if request.global_batch
        else f"local batch {request.local_batch}"
    )
    if dominates:
        out.append(
            f"staging takes over half the time to train from {dominates:,} nodes on ({policy})"
        )
    elif checked:
        out.append(
            f"staging stays under half the time to train at every power-of-two node count up to "
            f"{checked:,}, the largest with an RCP and a sample per device ({policy})"
        )
    else:
        out.append(
            f"staging dominance: no power-of-two node count has an RCP for its global batch ({policy})"
        )
    return out + _batch_answers(request, costs, busy)


def _batch_answers(request: Request, costs: ModelCosts, busy: float) -> list[str]:
    """What local batch keeps a device busy, and whether the input pipeline keeps up."""
    m, bench, out = request.machine, request.benchmark, []
    bound = smallest_compute_bound_local_batch(m, costs, request.precision)
    intensity = costs.flops_train / (
        costs.activation_bytes_train * model.ELEMENT_BYTES[request.precision] / 4
    )
    ridge = m.peak(request.precision) / m.memory_bytes_per_s
    out.append(
        f"local batch: compute-bound from {bound} sample(s) per device"
        if bound
        else f"local batch: memory-bound at every batch ({intensity:.0f} FLOP per byte of activation traffic, "
        f"below the device's ridge of {ridge:.0f})"
    )
    for nodes in sorted({min(request.nodes), max(request.nodes)}):
        b = smallest_busy_local_batch(m, costs, bench, nodes, busy, request.precision)
        out.append(
            f"at {nodes} nodes a device is busy {busy:.0%} of a step from local batch {b}"
            if b
            else f"at {nodes} nodes no local batch up to 4096 keeps a device {busy:.0%} busy (the allreduce dominates)"
        )
    if costs.input_samples_per_s_per_core:
        out.append(
            f"input pipeline: this project's reader measured {costs.input_samples_per_s_per_core:.2f} samples/s "
            f"per core; headroom < 1 means {m.cores_per_node} cores could not feed a node's devices "
            f"(not counted in the time to train: the published runs read with their own pipelines)"
        )
    return out


def staging_dominates_from(
    machine: Machine,
    costs: ModelCosts,
    dataset: Dataset,
    benchmark: str,
    global_batch_for,
    epochs_for,
    precision: str | None = None,
    instances: int = 1,
    max_nodes: int = 1 << 16,
) -> tuple[int | None, int | None]:
    """(the smallest power-of-two node count at which staging takes more than half the time to
    train, the largest node count that could be checked), each None when there is none.

    Args:
      global_batch_for: nodes -> global batch (a fixed one, or devices x local batch).
      epochs_for: global batch -> epochs (None without an RCP: that node count cannot be checked).
    """
    nodes, checked = 1, None
    while nodes <= max_nodes:
        batch = global_batch_for(nodes)
        epochs = epochs_for(batch)
        if epochs is not None and batch >= nodes * machine.devices_per_node:
            checked = nodes
            p = model.project(
                machine, costs, dataset, benchmark, nodes, batch, epochs, precision, instances
            )
            if p.shares()["staging"] > 0.5:
                return nodes, checked
        nodes *= 2
    return None, checked


def smallest_busy_local_batch(
    machine: Machine,
    costs: ModelCosts,
    benchmark: str,
    nodes: int,
    busy: float = 0.9,
    precision: str | None = None,
    max_batch: int = 4096,
) -> int | None:
    """The smallest local batch whose step is at least `busy` device time (the rest: visible allreduce)."""
    precision = precision or machine.precision
    efficiency = machine.efficiency_for(benchmark)
    visible = (1 - machine.allreduce_overlap) * model.allreduce_seconds(
        machine, costs.gradient_bytes, nodes
    )
    for b in range(1, max_batch + 1):
        device = max(
            model.compute_seconds(machine, costs, b, precision),
            model.memory_seconds(machine, costs, b, precision),
        )
        device /= efficiency
        if device / (device + visible) >= busy:
            return b
    return None


def smallest_compute_bound_local_batch(
    machine: Machine, costs: ModelCosts, precision: str | None = None
) -> int | None:
    """The smallest local batch at which compute, not memory traffic, bounds a device's step.

    None when the model's arithmetic intensity is below the device's ridge point: then every batch
    is memory-bound (the per-step weight traffic only makes small batches more so).
    """
    precision = precision or machine.precision
    per_sample_compute = costs.flops_train / machine.peak(precision)
    per_sample_memory = (
        costs.activation_bytes_train
        * model.ELEMENT_BYTES[precision]
        / 4
        / machine.memory_bytes_per_s
    )
    if per_sample_compute <= per_sample_memory:
        return None
    weights = costs.weight_bytes_train / machine.memory_bytes_per_s
    return max(1, math.ceil(weights / (per_sample_compute - per_sample_memory)))
