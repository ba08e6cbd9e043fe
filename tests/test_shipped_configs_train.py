"""Every shipped config trains: `--tiny` (runtime.tiny) shrinks it into a few steps of one epoch.

Loading a config (tests/test_config.py) does not show that its model builds, its optimizer
and schedule step, its logging and TensorBoard work; a tiny run of each does, in seconds.
The data are the tests' small synthetic sets, so the sample shape is set to theirs; every
other key of the config stays (closed hyperparameters, precision, optimizer, schedule).
"""

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from common import benchmarks
from tests import conftest, helpers

SHAPE_OF_TEST_DATA = {
    "cosmoflow": [
        "--set",
        f"data.sample_shape={conftest.TINY['size']},{conftest.TINY['size']},"
        f"{conftest.TINY['size']},4",
    ],
    "deepcam": [
        "--set",
        f"data.height={conftest.DEEPCAM_TINY['height']}",
        "--set",
        f"data.width={conftest.DEEPCAM_TINY['width']}",
    ],
}
CONFIGS = [
    (name, path)
    for name in benchmarks.names()
    for path in [
        helpers.REPO / benchmarks.get(name).synthetic_config,
        *benchmarks.closed_configs(name),
    ]
]


def _is_slow(name, path) -> bool:
    fast = [helpers.REPO / benchmarks.get(name).synthetic_config]
    if name == "cosmoflow":
        fast.append(benchmarks.closed_configs(name)[0])
    return path not in fast


def _tier(name, path):
    """Each benchmark's synthetic config, and CosmoFlow's first closed config, in the fast tier; the
    closed configs differ from one another only in batch and hyperparameter values
    (test_closed_configs checks each against the RCPs), so the other tiny runs (a DeepCAM one traces
    for seconds) are in the slow tier, DeepCAM's at 1/16 of the reference's width."""
    marks = pytest.mark.slow if _is_slow(name, path) else ()
    return pytest.param(name, path, id=path.stem, marks=marks)


@pytest.mark.parametrize("name,config", [_tier(name, path) for name, path in CONFIGS])
def test_every_shipped_config_trains_tiny(name, config, cosmo_data, deepcam_data, tmp_path):
    bench = benchmarks.get(name)
    data = cosmo_data if name == "cosmoflow" else deepcam_data
    out = tmp_path / "run"
    assert helpers.REPO / bench.train_script == helpers.REPO / name / "train.py"
    proc = helpers.run(
        helpers.train_cmd(
            name,
            config,
            bench.data_flag,
            data,
            bench.output_flag,
            out,
            "--tiny",
            "--tensorboard",
            *SHAPE_OF_TEST_DATA[name],
            *(helpers.DEEPCAM_NARROW if name == "deepcam" and _is_slow(name, config) else []),
        ),
        timeout=600,
    )
    # 3: trained, target not reached (a tiny run is a smoke run; its log says aborted).
    assert proc.returncode in (0, 3), helpers.failure_output(proc)
    assert "runtime.tiny: the config is shrunk" in proc.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert [h["epoch"] for h in summary["history"]] == [1]
    assert 0 < summary["history"][0]["loss"] < float("inf")
    assert summary["weights_in_sync"]
    resolved = (out / "config.yaml").read_text()
    assert "tiny: true" in resolved
    assert '"key": "run_stop"' in (out / "mlperf.log").read_text().splitlines()[-1]

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"]) | set(events.Tags()["tensors"])
    assert {
        "train/loss",
        "train/learning_rate",
        "train/samples_per_s",
        f"eval/{summary['metric_name']}",
    } <= scalars
