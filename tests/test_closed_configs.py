"""Every shipped closed-division config reproduces its entry of the MLPerf HPC RCP table.

The table is mlperf_logging's own (rcp_checker/hpc_3.0.0/rcps_<benchmark>.json):
the hyperparameters the run logs must be that entry's, the launch line in the
config's header must give that global batch, the LR schedule must be the
reference's at every step, and a launch at another global batch must stop at init.
"""

import json
import re
from pathlib import Path

import mlperf_logging
import numpy as np
import pytest

from common import benchmarks
from common.config import load_config
from common.errors import ConfigError
from cosmoflow.config import CosmoFlowConfig
from cosmoflow.task import CosmoFlowTask
from tests.helpers import REPO
from tests.test_lr_schedule import reference_cosmoflow_lr, reference_deepcam_lrs

RCP_DIR = Path(mlperf_logging.__file__).parent / "rcp_checker" / "hpc_3.0.0"
BENCHMARKS = {
    name: (benchmarks.config_class(name), benchmarks.task_class(name))
    for name in benchmarks.names()
}
CLOSED = [path for name in benchmarks.names() for path in benchmarks.closed_configs(name)]


def rcp_entries(benchmark: str) -> dict:
    table = json.loads((RCP_DIR / f"rcps_{benchmark}.json").read_text())
    return {entry["BS"]: entry["Hyperparams"] for entry in table.values()}


def load(path):
    benchmark = path.name.split("_")[0]
    config_class, task = BENCHMARKS[benchmark]
    return benchmark, load_config(config_class, path, {"data.data_dir": "/data"}), task


def local_batch(cfg) -> int:
    return getattr(cfg.data, "local_batch_size", None) or cfg.data.batch_size


def same(a, b) -> bool:
    """RCP values are sometimes strings ('0.1', '9000') and sometimes lists."""
    if isinstance(b, list):
        return (
            isinstance(a, (list, tuple))
            and len(a) == len(b)
            and all(same(x, y) for x, y in zip(a, b))
        )
    if isinstance(b, str):
        try:
            b = float(b)
        except ValueError:
            return a == b
    if isinstance(a, str) or isinstance(b, str) or isinstance(a, bool) or isinstance(b, bool):
        return a == b
    return bool(np.isclose(float(a), float(b), rtol=1e-9))


def test_one_closed_config_per_rcp_batch_size():
    for benchmark in BENCHMARKS:
        shipped = {
            load(p)[1].train.global_batch_size for p in CLOSED if p.name.startswith(benchmark)
        }
        assert shipped == set(rcp_entries(benchmark)), benchmark


@pytest.mark.parametrize("path", CLOSED, ids=lambda p: p.name)
def test_config_logs_exactly_its_rcp_entry(path):
    benchmark, cfg, task = load(path)
    gbs = cfg.train.global_batch_size
    assert path.stem.endswith(f"_gbs{gbs}") and cfg.mlperf.division == "closed"
    rcp = rcp_entries(benchmark)[gbs]
    logged = task(cfg).mlperf_hyperparameters(gbs) | {"global_batch_size": gbs}
    if benchmark == "deepcam":
        logged |= {
            "batchnorm_groupsize": cfg.model.batchnorm_group_size,  # the RCP's spelling
            "num_workers": gbs // local_batch(cfg),
        }
    for key, value in rcp.items():
        if key == "opt_learning_rate_decay_factor" and not isinstance(value, list):
            # The reference logs only the largest decay factor (max over its schedule).
            assert same(max(logged[key]), value), key
        else:
            assert key in logged and same(logged[key], value), (key, logged.get(key), value)


@pytest.mark.parametrize("path", CLOSED, ids=lambda p: p.name)
def test_launch_line_gives_the_global_batch(path):
    _, cfg, _ = load(path)
    header = path.read_text().split("\noutput_dir:")[0]
    nodes, per_node = map(int, re.search(r"srun -N (\d+) --ntasks-per-node (\d+)", header).groups())
    ranks = nodes * per_node
    assert (
        ranks * local_batch(cfg) * cfg.train.gradient_accumulation_frequency
        == cfg.train.global_batch_size
    )
    assert (
        f"{ranks} ranks x local batch {local_batch(cfg)} = global batch {cfg.train.global_batch_size}"
        in header
    )


@pytest.mark.parametrize("path", CLOSED, ids=lambda p: p.name)
def test_schedule_is_the_references_at_every_step(path):
    benchmark, cfg, task = load(path)
    gbs, steps_per_epoch = cfg.train.global_batch_size, 5
    _, schedule = task(cfg).build_optimizer(gbs, steps_per_epoch)
    rcp = rcp_entries(benchmark)[gbs]
    if benchmark == "cosmoflow":
        peak = rcp["opt_base_learning_rate"]
        o = cfg.optimizer
        n = 130 * steps_per_epoch
        oracle = [
            reference_cosmoflow_lr(
                j // steps_per_epoch,
                peak / rcp["opt_learning_rate_warmup_factor"],
                peak,
                rcp["opt_learning_rate_warmup_epochs"],
                dict(zip(o.decay_boundary_epochs, o.decay_factors)),
            )
            for j in range(n)
        ]
    else:
        kind = rcp["scheduler_type"]
        n = 20000 if kind == "cosine_annealing" else max(rcp["scheduler_milestones"]) + 600
        oracle = reference_deepcam_lrs(
            kind,
            rcp["opt_lr"],
            n,
            rcp["scheduler_lr_warmup_steps"],
            rcp.get("scheduler_milestones", ()),
            float(rcp.get("scheduler_decay_rate", 0.1)),
            int(rcp.get("scheduler_t_max", 1)),
            float(rcp.get("scheduler_eta_min", 0.0)),
        )
    np.testing.assert_allclose(
        [schedule.at_step(j) for j in range(n)], oracle, rtol=1e-9, atol=1e-15
    )


@pytest.mark.parametrize("path", [CLOSED[0], CLOSED[-1]], ids=lambda p: p.name)
def test_closed_run_at_another_global_batch_stops_at_init(path):
    _, cfg, task = load(path)
    ranks = cfg.train.global_batch_size // local_batch(cfg)
    with pytest.raises(
        ConfigError,
        match=rf"train\.global_batch_size'={cfg.train.global_batch_size}.*launch {ranks} ranks",
    ):
        task(cfg).shard(0, ranks * 2)


COSMOFLOW_CONFIGS = sorted(REPO.glob("cosmoflow/configs/*.yaml")) + [
    REPO / "tests/configs/cosmoflow_tiny.yaml"
]


@pytest.mark.parametrize("path", COSMOFLOW_CONFIGS, ids=lambda p: p.name)
@pytest.mark.parametrize("batch_ratio", [1, 4])
def test_cosmoflow_log_says_what_the_schedule_does(path, batch_ratio):
    # At the config's own global batch and at 4x (open division, LR scaled):
    # opt_base_learning_rate is the LR after warmup, and the warmup starts at
    # opt_base_learning_rate / opt_learning_rate_warmup_factor.
    cfg = load_config(CosmoFlowConfig, path, {"data.data_dir": "/data", "mlperf.division": "open"})
    gbs = cfg.train.global_batch_size * batch_ratio
    logged = CosmoFlowTask(cfg).mlperf_hyperparameters(gbs)
    _, schedule = CosmoFlowTask(cfg).build_optimizer(gbs, steps_per_epoch=3)
    warmup = logged["opt_learning_rate_warmup_epochs"]
    if (
        warmup
    ):  # without warmup epochs the factor is only the scale factor, as the reference logs it
        assert schedule.at_epoch(0) == pytest.approx(
            logged["opt_base_learning_rate"] / logged["opt_learning_rate_warmup_factor"]
        )
    assert schedule.at_epoch(warmup) == pytest.approx(logged["opt_base_learning_rate"])
    if batch_ratio == 1:
        assert logged["opt_base_learning_rate"] == pytest.approx(cfg.optimizer.base_learning_rate)
        assert logged["opt_learning_rate_warmup_factor"] == pytest.approx(
            cfg.optimizer.warmup_factor
        )
    else:
        assert logged["opt_base_learning_rate"] == pytest.approx(
            cfg.optimizer.base_learning_rate * batch_ratio
        )
