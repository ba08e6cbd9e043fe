"""The projection against published MLPerf HPC results (offline/published_points.yaml).

`--calibrate POINT`: the efficiency a calibration point implies. `--validate`: every point projected
with the efficiency of its calibration point, within WITHIN of its published time or explained.
"""

import dataclasses

from common.errors import InputError
from offline.projection import inputs, model, rcp
from offline.projection.model import Dataset, Machine, ModelCosts

WITHIN = 0.25  # the accuracy the validation asks for


def calibrate_efficiency(
    machine: Machine,
    costs: ModelCosts,
    dataset: Dataset,
    benchmark: str,
    nodes: int,
    global_batch: int,
    epochs: float,
    published_s: float,
    precision: str | None = None,
    instances: int = 1,
    staging_timed: bool = True,
) -> float:
    """The efficiency with which `model.project` gives `published_s` at this point, `epochs` epochs.

    Device time (steps and evaluation) scales as 1/efficiency; staging and the allreduce do not,
    so efficiency = epochs x device time at efficiency 1 / (published - staging - allreduce).

    Raises:
      ValueError: staging and allreduce alone already take longer than `published_s`.
    """
    ideal = model.project(
        machine.with_efficiency(benchmark, 1.0),
        costs,
        dataset,
        benchmark,
        nodes,
        global_batch,
        epochs,
        precision,
        instances,
        staging_timed,
    )
    device_s = epochs * (ideal.steps_per_epoch * ideal.device_step_s + ideal.eval_epoch_s)
    rest_s = ideal.timed_staging_s + epochs * ideal.steps_per_epoch * ideal.visible_allreduce_s
    if published_s <= rest_s:
        raise ValueError(
            f"staging and allreduce ({rest_s:.1f} s) exceed the published {published_s:.1f} s"
        )
    return device_s / (published_s - rest_s)


def point_projection(
    point: dict, costs: ModelCosts, epochs: float, efficiency: float | None = None
) -> model.Projection:
    """A published point projected with `epochs` epochs (and `efficiency` instead of the machine file's)."""
    machine = inputs.load_machine(point["machine"])
    if efficiency is not None:
        machine = machine.with_efficiency(point["benchmark"], efficiency)
    return model.project(
        machine,
        costs,
        inputs.DATASETS[point["benchmark"]],
        point["benchmark"],
        point["nodes"],
        point["global_batch"],
        epochs,
        None,
        point["instances"],
        point["staging_timed"],
    )


def calibrate(name: str, points: dict | None = None) -> float:
    """The efficiency a calibration point implies (its logged epochs; see calibrate_efficiency)."""
    points = points or inputs.load_points()
    point = points[name]
    costs, _ = inputs.load_costs(point["benchmark"])
    machine = inputs.load_machine(point["machine"])
    return calibrate_efficiency(
        machine,
        costs,
        inputs.DATASETS[point["benchmark"]],
        point["benchmark"],
        point["nodes"],
        point["global_batch"],
        point["logged_epochs"],
        point["published_minutes"] * 60,
        None,
        point["instances"],
        point["staging_timed"],
    )


@dataclasses.dataclass(frozen=True)
class Check:
    """A published point against its projection, and the error's parts."""

    name: str
    point: dict
    efficiency: float
    epochs_rcp: float | None
    projected_min: float | None  # RCP epochs: what a user gets
    projected_logged_min: float  # the epochs the runs logged
    parts: dict  # error share of each term (of the published time)

    @property
    def error(self) -> float | None:
        return (
            None
            if self.projected_min is None
            else self.projected_min / self.point["published_minutes"] - 1
        )

    @property
    def within(self) -> bool:
        return self.error is not None and abs(self.error) <= WITHIN

    @property
    def dominant(self) -> str:
        return max(self.parts, key=lambda k: abs(self.parts[k]))


def check_point(name: str, points: dict, ruleset: str = "3.0.0") -> Check:
    """A point projected with the efficiency of its calibration point (itself for a calibration point).

    The error splits into epochs (RCP mean vs the epochs logged), staging (projected vs logged,
    where the logs time it) and training (the rest: compute, allreduce and eval per epoch).
    """
    point = points[name]
    source = name if point["role"] == "calibration" else point["calibrated_by"]
    if point["role"] == "validation" and (
        source == name or points[source]["role"] != "calibration"
    ):
        raise InputError(f"{name}: calibrated_by must name another, calibration point")
    efficiency = calibrate(source, points)
    costs, _ = inputs.load_costs(point["benchmark"])
    epochs = rcp.rcp_epochs(rcp.rcp_means(point["benchmark"], ruleset), point["global_batch"])
    with_rcp = point_projection(point, costs, epochs, efficiency) if epochs is not None else None
    logged = point_projection(point, costs, point["logged_epochs"], efficiency)
    published_s = point["published_minutes"] * 60
    parts = {
        "epochs": (
            (with_rcp.time_to_train_s if with_rcp else logged.time_to_train_s)
            - logged.time_to_train_s
        )
        / published_s
    }
    staging_error = 0.0
    if "logged_staging_s" in point and point["staging_timed"]:
        staging_error = (logged.timed_staging_s - point["logged_staging_s"]) / published_s
        parts["staging"] = staging_error
    parts["training"] = (logged.time_to_train_s - published_s) / published_s - staging_error
    return Check(
        name,
        point,
        efficiency,
        epochs,
        with_rcp and with_rcp.time_to_train_s / 60,
        logged.time_to_train_s / 60,
        parts,
    )


def validation_table(checks: list) -> str:
    """The markdown table of docs/scaling.md's "Scaling projection" section."""
    rows = [
        "| point | nodes x devices | global batch | published | projected (RCP epochs) | error | "
        "projected (logged epochs) | error | efficiency | error parts: epochs / staging / training |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in checks:
        p = c.point
        machine = inputs.load_machine(p["machine"])
        role = "calibration point" if p["role"] == "calibration" else f"from {p['calibrated_by']}"
        projected = (
            "no RCP"
            if c.projected_min is None
            else f"{c.projected_min:.2f} min ({c.epochs_rcp:.1f} ep.)"
        )
        error = "-" if c.error is None else f"{c.error:+.0%}"
        logged_error = c.projected_logged_min / p["published_minutes"] - 1
        parts = " / ".join(
            "-" if k not in c.parts else f"{c.parts[k]:+.0%}"
            for k in ("epochs", "staging", "training")
        )
        rows.append(
            f"| {c.name} ({p['benchmark']}) | {p['nodes']} x {machine.devices_per_node} | {p['global_batch']} | "
            f"{p['published_minutes']:.2f} min ({p['logged_epochs']:g} ep.) | {projected} | {error} | "
            f"{c.projected_logged_min:.2f} min | {logged_error:+.0%} | {c.efficiency:.3f}, {role} | {parts} |"
        )
    return "\n".join(rows)


def run_validation(ruleset: str) -> int:
    """--validate: the table, then each point's verdict and source."""
    points = inputs.load_points()
    checks = [check_point(name, points, ruleset) for name in points]
    print(validation_table(checks))
    print()
    for c in checks:
        if c.point["role"] == "validation":
            verdict = "within" if c.within else f"OUTSIDE (dominant term: {c.dominant})"
            print(f"{c.name}: {verdict} +-{WITHIN:.0%}; source: {c.point['source']}")
            if not c.within:
                print(
                    f"    {c.point.get('outside_because', 'no reason recorded in offline/published_points.yaml')}"
                )
        else:
            print(f"{c.name}: calibration point; source: {c.point['source']}")
    return 0
