"""The benchmark's measured step time beside offline.projection's for the same model, local batch and machine.

The projection's costs are the benchmarked model's own, measured as offline/measure_model_costs.py
measures the closed models (common/run/characterization.py: TensorFlow's profiler on the forward
graph of one sample, a training step 3x forward; memory traffic a per-layer lower bound), so any
config can be judged, not only the full-size ones whose costs offline/model_costs/ stores. The
projected step is offline.projection.model.project's at this job's node count and this run's local
batch: the device step (roofline / efficiency) plus the allreduce it does not overlap.
"""

import dataclasses

import numpy as np

# Keras dtype policy of the run -> the projection's precision.
_PRECISIONS = {"float32": "fp32", "mixed_float16": "fp16", "mixed_bfloat16": "bf16"}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The measured and the projected step of one benchmark run (seconds)."""

    measured_step_s: float
    projected_step_s: float
    precision: str
    bound: str
    machine: str
    efficiency: float
    tolerance: float
    note: str = ""

    @property
    def ratio(self) -> float:
        return self.measured_step_s / self.projected_step_s

    @property
    def within(self) -> bool:
        return 1 / self.tolerance <= self.ratio <= self.tolerance

    def line(self) -> str:
        verdict = "within" if self.within else "outside"
        return (
            f"measured {self.measured_step_s * 1e3:.2f} ms/step, projected {self.projected_step_s * 1e3:.2f} "
            f"ms/step ({self.precision}, {self.bound}-bound, {self.machine}, efficiency {self.efficiency:g}): "
            f"ratio {self.ratio:.2f}, {verdict} the tolerance (x{self.tolerance:g} either way)"
            + (f"; {self.note}" if self.note else "")
        )


def model_costs(task):
    """offline.projection's ModelCosts of the task's model (float32), measured on this host now."""
    from common.run import characterization
    from offline.projection.model import ModelCosts

    model = task.build_model(None)
    forward = characterization.forward_flops_per_sample(model, model.input_shape[1:])
    weights = sum(int(np.prod(w.shape)) * w.dtype.size for w in model.weights)
    activations = characterization.forward_bytes_per_sample(model) - weights
    params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    return ModelCosts(
        flops_train=3 * forward,
        flops_forward=forward,
        activation_bytes_train=3 * activations,
        activation_bytes_forward=activations,
        weight_bytes_train=3 * weights,
        gradient_bytes=4 * params,
    )


def projection_precision(run_precision: str, device: str, peaks: dict) -> tuple[str, str]:
    """The projection's precision for a run's dtype policy, and a note when the machine file lacks it.

    float32 on a GPU is TF32 where the machine file has a TF32 peak: TensorFlow runs float32 matmuls
    and convolutions as TF32 on Ampere and newer by default.
    """
    precision = _PRECISIONS.get(run_precision, "fp32")
    if precision == "fp32" and device == "gpu" and "tf32" in peaks:
        precision = "tf32"
    if precision in peaks:
        return precision, ""
    fallback = "fp32" if "fp32" in peaks else next(iter(peaks))
    return fallback, f"the machine file has no {precision} peak: projected at {fallback}"


def judge(
    machine, costs, benchmark: str, throughput: dict, nodes: int, device: str, tolerance: float
) -> Verdict:
    """The run's benchmark figures (summary.json's 'throughput') against the projection on `machine`."""
    from offline.projection import inputs, model

    groups = throughput["ranks"] // max(1, throughput["spatial_ranks"])
    local_batch = throughput["global_batch_size"] / groups
    precision, note = projection_precision(throughput["precision"], device, machine.peak_flop_per_s)
    notes = [note]
    if throughput["spatial_ranks"] > 1:
        notes.append(
            "a split run: projected as unsplit (offline.projection.spatial models the split)"
        )
    devices = nodes * machine.devices_per_node
    projection = model.project(
        machine,
        costs,
        inputs.DATASETS[benchmark],
        benchmark,
        nodes=nodes,
        global_batch=max(1, round(local_batch * devices)),
        epochs=None,
        precision=precision,
        staging_timed=False,
    )
    if devices != groups:
        notes.append(
            f"the machine file has {machine.devices_per_node} device(s) per node, this job "
            f"{groups / nodes:g} rank(s) per node: compared per device at local batch {local_batch:g}"
        )
    return Verdict(
        measured_step_s=throughput["seconds"] / throughput["steps"],
        projected_step_s=projection.step_s,
        precision=precision,
        bound=projection.bound,
        machine=machine.name,
        efficiency=machine.efficiency_for(benchmark),
        tolerance=tolerance,
        note="; ".join(filter(None, notes)),
    )
