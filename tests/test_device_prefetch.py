"""The input pipeline's last stage, batches prefetched to the device (common.inputs.pipeline).

No GPU here: where the batches go is proven on a second logical CPU in a process of its own
(tests/device_prefetch_probe.py), the stage's place at the end of the pipelines the run modes
consume by the Trainer in-process, and a run with the stage on by train.py's tiny run.
"""

import json
import os
import subprocess

import h5py
import numpy as np
import pytest
import tensorflow as tf

from common import cpu
from common.config import load_config
from common.inputs import pipeline
from common.reporting.events import Events
from common.run import benchmark_mode
from common.run import trainer as trainer_module
from common.runtime import configure
from cosmoflow import data as cosmoflow_data
from cosmoflow.task import CosmoFlowTask
from deepcam import data as deepcam_data
from tests import helpers
from tests.fake_distribution import OneRankDistribution

SIZE = 8  # CosmoFlow samples of SIZE^3 x 4; the probe reads them at this size
H, W = 16, 24


@pytest.mark.parametrize(
    "setting,device,target",
    [
        ("auto", "gpu", "/gpu:0"),
        ("auto", "cpu", "off"),
        ("on", "gpu", "/gpu:0"),
        ("on", "cpu", "/cpu:0"),
        ("off", "gpu", "off"),
        ("off", "cpu", "off"),
    ],
)
def test_where_batches_go_by_setting_and_device(setting, device, target):
    assert pipeline.target_device(setting, device) == target


def test_an_unknown_setting_is_refused():
    with pytest.raises(ValueError, match="auto, on or off"):
        pipeline.target_device("gpu", "gpu")


def _cosmoflow_files(directory, n, size=SIZE):
    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        helpers.write_tfrecord(
            directory / f"s{i}.tfrecord",
            rng.integers(0, 50, (size, size, size, 4)),
            rng.uniform(-1, 1, 4),
            gzip=False,
        )
    return sorted(str(p) for p in directory.iterdir())


def _deepcam_files(directory, n):
    directory.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i in range(n):
        with h5py.File(directory / f"s{i}.h5", "w") as f:
            f["climate/data"] = rng.uniform(-5, 20, (H, W, 16)).astype(np.float32)
            f["climate/labels_0"] = rng.integers(0, 3, (H, W)).astype(np.float32)
    return sorted(str(p) for p in directory.iterdir())


def _stage_chain(ds) -> list:
    """The class names from the last transformation back, as far as the copy (TF 2.21's prefetching_ops)."""
    names = [type(ds).__name__]
    while names[-1] != "_CopyToDeviceDataset" and hasattr(ds, "_input_dataset"):
        ds = ds._input_dataset
        names.append(type(ds).__name__)
    return names


def test_the_stage_is_last_and_hands_over_the_compact_batches_unchanged(tmp_path):
    cosmo = cosmoflow_data.make_dataset(
        _cosmoflow_files(tmp_path / "c", 4),
        (SIZE, SIZE, SIZE, 4),
        2,
        "",
        training=True,
        seed=0,
        deterministic=True,
    )
    deepcam = deepcam_data.make_dataset(
        _deepcam_files(tmp_path / "d", 4),
        channels=range(16),
        height=H,
        width=W,
        batch_size=2,
        training=True,
        seed=0,
        deterministic=True,
    )
    for host, dtypes in ((cosmo, (tf.int16, tf.float32)), (deepcam, (tf.float32, tf.uint8))):
        staged = pipeline.prefetch_to(host, "/cpu:0")
        assert _stage_chain(staged) == ["_PrefetchDataset", "_CopyToDeviceDataset"]
        assert staged._input_dataset._target_device == "/cpu:0"
        assert (
            staged.element_spec == host.element_spec
            and tuple(s.dtype for s in staged.element_spec) == dtypes
        )
        step = tf.function(
            lambda x, y: (
                tf.reduce_sum(tf.cast(x, tf.float64)) + tf.reduce_sum(tf.cast(y, tf.float64))
            )
        )
        expected = [float(step(*b)) for b in host.take(3)]
        it = iter(staged)
        assert [float(step(*next(it))) for _ in range(3)] == expected
        # The negative control: 'off' leaves the pipeline as the task built it.
        assert pipeline.prefetch_to(host, "off") is host
        assert "_CopyToDeviceDataset" not in _stage_chain(host)


def test_batches_arrive_on_the_target_device_and_the_steps_take_them(tmp_path):
    cosmo_dir, deepcam_dir = tmp_path / "c", tmp_path / "d"
    _cosmoflow_files(cosmo_dir, 4)
    _deepcam_files(deepcam_dir, 4)
    proc = subprocess.run(
        [
            helpers.PYTHON,
            helpers.REPO / "tests" / "device_prefetch_probe.py",
            cosmo_dir,
            deepcam_dir,
        ],
        cwd=helpers.REPO,
        env=helpers.env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    found = {r["name"]: r for r in map(json.loads, proc.stdout.strip().splitlines())}
    for name, dtypes in (("cosmoflow", ["int16", "float32"]), ("deepcam", ["float32", "uint8"])):
        r = found[name]
        assert r["devices"] == ["/job:localhost/replica:0/task:0/device:CPU:1"], r
        assert r["host_devices"] == ["/job:localhost/replica:0/task:0/device:CPU:0"], (
            r
        )  # without the stage
        assert r["dtypes"] == r["host_dtypes"] == dtypes and r["same_values"], r
        assert np.isfinite(r["step_loss"]), r


def _tiny_cosmoflow(root):
    _cosmoflow_files(root / "train", 8, size=16)
    _cosmoflow_files(root / "validation", 8, size=16)
    return root


@pytest.mark.parametrize("setting,staged", [("on", True), ("off", False)])
def test_the_trainer_puts_the_stage_last_on_the_datasets_a_run_mode_reads(
    tmp_path, monkeypatch, setting, staged
):
    read = {}
    real = benchmark_mode.run_benchmark

    def spy(ctx, train_ds):
        read["train"] = train_ds
        return real(ctx, train_ds)

    monkeypatch.setattr(benchmark_mode, "run_benchmark", spy)
    cfg = load_config(
        CosmoFlowTask.config_class,
        helpers.REPO / "tests" / "configs" / "cosmoflow_tiny.yaml",
        {
            **CosmoFlowTask.tiny_overrides(None),
            "data.data_dir": str(_tiny_cosmoflow(tmp_path / "data")),
            "data.sample_shape": [16, 16, 16, 4],
            "runtime.prefetch_to_device": setting,
            "train.benchmark_steps": 2,
            "train.benchmark_warmup_steps": 0,
            "train.warmup_steps": 0,
        },
    )
    dist = OneRankDistribution()
    runtime = configure(cfg.runtime, dist)
    assert runtime["prefetch_to_device"] == ("/cpu:0" if staged else "off")
    trainer_module.Trainer(CosmoFlowTask(cfg), dist, Events([]), tmp_path / "run", runtime).run()
    assert (
        _stage_chain(read["train"])[:2] == ["_PrefetchDataset", "_CopyToDeviceDataset"]
    ) == staged
    # Behind the stage, the host pipeline runs on a private pool of the rank's cores.
    host = read["train"]._input_dataset._input_dataset if staged else read["train"]
    cores = cpu.intra_op_threads(os.environ, cpu.affinity(), dist.local_size).threads
    assert host.options().threading.private_threadpool_size == runtime["input_threads"] == cores


# A map of 16 calls that each sleep 50 ms, through host_options, in a process whose inter-op pool
# has one thread: the most calls that ran at once with a private pool of 4, of 1, and none.
_CONCURRENCY_PROBE = """
import json, os, threading, time
import tensorflow as tf
tf.config.threading.set_inter_op_parallelism_threads(1)
from common.inputs.pipeline import host_options

def most_at_once(threads):
    lock, now, most = threading.Lock(), [0], [0]
    def call(x):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.05)
        with lock:
            now[0] -= 1
        return x
    ds = tf.data.Dataset.range(16).map(
        lambda x: tf.numpy_function(call, [x], tf.int64), num_parallel_calls=tf.data.AUTOTUNE
    )
    list((ds if threads is None else ds.with_options(host_options(threads))).as_numpy_iterator())
    return most[0]

print(json.dumps({
    "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
    "cpus": len(os.sched_getaffinity(0)),
    "pool_4": most_at_once(4), "pool_1": most_at_once(1), "no_pool": most_at_once(None),
}))
"""


def test_the_host_pipeline_runs_as_many_calls_at_once_as_its_private_pool_not_the_inter_op_pool():
    proc = subprocess.run(
        [helpers.PYTHON, "-c", _CONCURRENCY_PROBE],
        cwd=helpers.REPO,
        env=helpers.env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["inter_op"] == 1, r
    # More at once than the inter-op pool's one thread.
    assert 2 < r["pool_4"] <= 4, r
    # The control: the same map on a private pool of one thread runs one call at a time.
    assert r["pool_1"] == 1, r
    # Without a private pool TensorFlow 2.21 runs up to the process's CPUs, whatever the inter-op pool.
    assert 1 <= r["no_pool"] <= r["cpus"], r


def test_a_tiny_run_trains_with_the_stage_on_and_says_where_batches_go(tmp_path):
    data = _tiny_cosmoflow(tmp_path / "data")
    out = tmp_path / "run"
    proc = helpers.run(
        helpers.train_cmd(
            "cosmoflow",
            helpers.REPO / "tests" / "configs" / "cosmoflow_tiny.yaml",
            "--data-dir",
            data,
            "--output-dir",
            out,
            "--tiny",
            "--set",
            "data.sample_shape=16,16,16,4",
            "--set",
            "runtime.prefetch_to_device=on",
        ),
        timeout=300,
    )
    assert proc.returncode in (0, 3), helpers.failure_output(proc)  # 3: target not reached
    runtime_line = next(
        line
        for line in proc.stdout.splitlines()
        if line.startswith("[init]") and "; runtime {" in line
    )
    assert "'prefetch_to_device': '/cpu:0'" in runtime_line, runtime_line
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runtime"]["prefetch_to_device"] == "/cpu:0"
    assert [h["epoch"] for h in summary["history"]] == [1] and np.isfinite(
        summary["history"][0]["loss"]
    )
