"""Epochs to converge at a global batch, from mlperf_logging's reference convergence points (RCPs).

As mlperf_logging's RCP checker reads its table: the olympic mean of each RCP's epochs, linear
interpolation between the two nearest batch sizes, nothing outside the table's range; the
pruned table as the checker prunes it.
"""

import importlib.util
import json
from pathlib import Path

from common.errors import InputError


def rcp_means(benchmark: str, ruleset: str = "3.0.0", rcp_pass: str = "full") -> dict:
    """{global batch: mean epochs} of mlperf_logging's table for `benchmark`, full or pruned."""
    means = olympic_means(rcp_records(benchmark, ruleset))
    return pruned_rcp_means(means) if rcp_pass == "pruned" else means


def rcp_records(benchmark: str, ruleset: str = "3.0.0") -> dict:
    """mlperf_logging's rcps_<benchmark>.json of hpc `ruleset`."""
    spec = importlib.util.find_spec("mlperf_logging")
    path = (
        Path(spec.submodule_search_locations[0])
        / "rcp_checker"
        / f"hpc_{ruleset}"
        / f"rcps_{benchmark}.json"
    )
    if not path.exists():
        raise InputError(f"mlperf_logging has no RCP table {path.name} for hpc {ruleset}")
    return json.loads(path.read_text())


def olympic_means(records) -> dict:
    """{global batch: RCP mean epochs} from an rcps_<benchmark>.json mapping, as the RCP checker
    computes them: the olympic mean (fastest and slowest run dropped) of 'Epochs to converge'."""
    means = {}
    for record in records.values():
        epochs = sorted(record["Epochs to converge"])
        means[int(record["BS"])] = sum(epochs[1:-1]) / (len(epochs) - 2)
    return dict(sorted(means.items()))


def pruned_rcp_means(means: dict) -> dict:
    """The RCP checker's pruned set: batch sizes below the fastest-converging one dropped, then
    every point that converges slower than the interpolation of its neighbours, left to right."""
    fastest = min(means, key=lambda bs: (means[bs], bs))
    kept = [bs for bs in sorted(means) if bs >= fastest]
    i = 1
    while i < len(kept) - 1:
        low, high = kept[i - 1], kept[i + 1]
        if means[kept[i]] > _interpolate(kept[i], low, means[low], high, means[high]):
            del kept[i]
            i -= 1
        i += 1
    return {bs: means[bs] for bs in kept}


def rcp_epochs(means: dict, global_batch: int) -> float | None:
    """Mean epochs to converge at `global_batch`: the RCP's own mean, or the linear interpolation
    between the nearest smaller and larger RCP batch sizes; None outside the table's range."""
    if global_batch in means:
        return means[global_batch]
    below = [bs for bs in means if bs < global_batch]
    above = [bs for bs in means if bs > global_batch]
    if not below or not above:
        return None
    low, high = max(below), min(above)
    return _interpolate(global_batch, low, means[low], high, means[high])


def _interpolate(x, x0, y0, x1, y1) -> float:
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
