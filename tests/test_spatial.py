"""Spatial parallelism (common.parallel.spatial, SpatialMesh): split samples compute the unsplit function.

Real Horovod ranks under horovodrun/Gloo (tests/spatial_probe.py, cosmoflow/train.py). Each
comparison of a split run with an unsplit one has a negative control: the same comparison
with the halo exchange switched off must fail.
"""

import json

import numpy as np
import pytest

from tests import helpers

PROBE = helpers.REPO / "tests" / "spatial_probe.py"


# The probe's launches, each (ranks, launcher, jobs): a launch (Python, TensorFlow and Horovod
# start-up, the rendezvous) costs more than most jobs, so each runs every job its tests need. A job
# is MODE:K[:no-halo][:no-overlap]: the split convolutions overlap their halo with their interior
# (the default) unless no-overlap.
LAUNCHES = {
    "1": (1, None, ["model:1"]),
    # Two "nodes" on this machine (helpers.two_nodes), a rank on each (a machine of one process per
    # node): the halo crosses between the nodes. Within a node: the 4-rank launch's groups.
    "2-nodes": (
        2,
        "two-nodes",
        [
            "halo:2",
            "layer:2",
            "layer:2:no-halo",
            "layer:2:no-overlap",
            "layer:2:no-overlap:no-halo",
            "model:2",
            "model:2:no-halo",
            "model:2:no-overlap",
        ],
    ),
    "4": (4, "gloo", ["halo:4", "layer:4", "model:4", "model:2", "labels:2"]),
    # MPI carries the halo as Gloo does: the slow tier's repetition (the 4-rank case: Gloo's).
    "2-mpi": (2, "mpi", ["halo:2"]),
}


@pytest.fixture(scope="module")
def probe(tmp_path_factory, cosmo_data):
    """probe(launch, job) -> each rank's results of `job`, from its launch (run once)."""
    launched = {}

    def results(launch: str, job: str) -> list[dict]:
        ranks, launcher, jobs = LAUNCHES[launch]
        if launch not in launched:
            out = tmp_path_factory.mktemp("probe")
            cmd = [helpers.PYTHON, PROBE, "--out", out, "--data-dir", cosmo_data, *jobs]
            proc = (
                helpers.LAUNCHERS[launcher](ranks, cmd, timeout=900)
                if launcher
                else helpers.run(cmd, timeout=900)
            )
            launched[launch] = out, proc
        out, proc = launched[launch]
        assert proc.returncode == 0, helpers.failure_output(proc)
        assert job in jobs
        return helpers.rank_results(out, job, ranks)

    return results


# ------------------------------------------------------------------ (a) the halo layer
@pytest.mark.parametrize("launch", ["2-nodes", "4", pytest.param("2-mpi", marks=pytest.mark.slow)])
def test_halo_exchange_gives_the_neighbours_planes_and_zeros_at_the_faces(probe, launch):
    if launch == "2-mpi" and not helpers.horovod_has_mpi():
        pytest.skip(
            "Horovod was built without MPI (install libopenmpi-dev, then `make install` rebuilds it)"
        )
    ranks = LAUNCHES[launch][0]
    for r in probe(launch, f"halo:{ranks}"):
        for dtype in ("float32", "bfloat16"):  # bfloat16 crosses Horovod as float32, and comes back
            np.testing.assert_array_equal(r[f"got_{dtype}"], r["want"])
            assert str(r[f"dtype_{dtype}"]) == dtype


@pytest.mark.parametrize(
    "launch,job", [("2-nodes", "layer:2"), ("4", "layer:4"), ("2-nodes", "layer:2:no-overlap")]
)
def test_halo_convolution_equals_the_padded_whole_tensor_exactly(probe, launch, job):
    results = probe(launch, job)
    for r in results:  # integer data: no rounding, so equality is exact
        np.testing.assert_array_equal(r["out"], r["whole_out"])
        np.testing.assert_array_equal(r["d_input"], r["whole_d_input"])
    # The kernel and bias gradients are partial sums over the slabs: their sum is the whole one.
    np.testing.assert_array_equal(sum(r["d_kernel"] for r in results), results[0]["whole_d_kernel"])
    np.testing.assert_array_equal(sum(r["d_bias"] for r in results), results[0]["whole_d_bias"])
    assert not np.array_equal(results[0]["d_kernel"], results[0]["whole_d_kernel"])


@pytest.mark.parametrize("job", ["layer:2:no-halo", "layer:2:no-overlap:no-halo"])
def test_halo_convolution_without_the_exchange_differs_at_the_slab_faces(probe, job):
    r = probe("2-nodes", job)[0]
    differs = np.any(r["out"] != r["whole_out"], axis=(0, 2, 3, 4))
    assert differs[-1] and not differs[0], differs  # only the plane next to the neighbour


# ------------------------------------------------------------------ (b, c) the whole model
@pytest.fixture(scope="module")
def unsplit(probe):
    return probe("1", "model:1")[0]


def _relative_error(got, want) -> float:
    """Largest difference over the tensor's own scale (a gradient holds near-zero entries)."""
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def _worst_errors(results, reference) -> dict:
    n_vars = sum(k.startswith("grad_") for k in reference)
    worst = {"pred": 0.0, "loss": 0.0, "grad": 0.0, "weight": 0.0}
    for r in results:
        groups, group = int(r["groups"]), int(r["group"])
        batch = len(reference["pred"]) // groups
        worst["pred"] = max(
            worst["pred"],
            _relative_error(r["pred"], reference["pred"][group * batch : (group + 1) * batch]),
        )
        for i in range(n_vars):
            worst["grad"] = max(
                worst["grad"], _relative_error(r[f"grad_{i}"], reference[f"grad_{i}"])
            )
            worst["weight"] = max(
                worst["weight"], _relative_error(r[f"weight_{i}"], reference[f"weight_{i}"])
            )
    # Each rank's loss is its group's mean; the mean over the groups is the global batch's.
    per_group = {int(r["group"]): float(r["loss"]) for r in results}
    worst["loss"] = abs(np.mean(list(per_group.values())) - float(reference["loss"])) / abs(
        float(reference["loss"])
    )
    return worst


@pytest.mark.parametrize(
    "launch,job,gathered,overlapped",
    [
        ("2-nodes", "model:2", "gather_before_flatten", ["conv1", "conv2", "conv3", "conv4"]),
        ("4", "model:4", "gather_before_pool5", ["conv1", "conv2", "conv3"]),  # conv4: 2 planes
        ("4", "model:2", "gather_before_flatten", ["conv1", "conv2", "conv3", "conv4"]),
        ("2-nodes", "model:2:no-overlap", "gather_before_flatten", []),
    ],
)
def test_split_model_step_equals_the_one_rank_step(
    probe, unsplit, launch, job, gathered, overlapped
):
    # A non-trivial reference: predictions off the tanh's rails, every gradient non-zero.
    assert np.max(np.abs(unsplit["pred"])) < 1.1 and np.ptp(unsplit["pred"]) > 1e-3
    assert all(np.any(unsplit[k] != 0) for k in unsplit if k.startswith("grad_"))
    results = probe(launch, job)
    ranks, spatial_ranks = LAUNCHES[launch][0], int(job.split(":")[1])
    assert gathered in list(results[0]["layers"])
    assert (
        list(results[0]["overlapped"]) == overlapped
    )  # the layers that computed their interior during the halo
    # The 2-rank launch's group spans its two "nodes"; the 4-rank launch's groups sit on its one.
    groups = ranks // spatial_ranks
    where = "across 2 nodes" if launch == "2-nodes" else "on one node"
    assert {str(r["described"]) for r in results} == {
        f"{spatial_ranks}-way spatial x {groups} data-parallel group(s), each {where}"
    }
    assert sorted({int(r["group"]) for r in results}) == list(range(groups))
    # The conv kernels' gradients are summed over the group (scale K before the average).
    assert set(results[0]["scales"]) == {1.0, float(spatial_ranks)}
    worst = _worst_errors(results, unsplit)
    assert all(v < 1e-5 for v in worst.values()), worst


def test_without_the_halo_the_model_comparison_fails(probe, unsplit):
    worst = _worst_errors(probe("2-nodes", "model:2:no-halo"), unsplit)
    assert worst["pred"] > 1e-3 and worst["grad"] > 1e-3, worst


# ------------------------------------------------------------------ (e) input by group
def test_every_rank_of_a_group_reads_the_same_samples_in_the_same_order(probe):
    results = probe("4", "labels:2")
    by_rank = {int(r["group"]) * 2 + int(r["index"]): r for r in results}
    for first in (0, 2):
        a, b = by_rank[first], by_rank[first + 1]
        np.testing.assert_array_equal(a["labels"], b["labels"])
        assert a["slabs"].shape[2] == b["slabs"].shape[2] == 16  # half of the 32 planes each
        assert not np.array_equal(a["slabs"], b["slabs"])
    assert not np.array_equal(by_rank[0]["labels"], by_rank[2]["labels"])
    # Two epochs, each a new order of the group's shard.
    steps = len(by_rank[0]["labels"]) // 2
    assert not np.array_equal(by_rank[0]["labels"][:steps], by_rank[0]["labels"][steps:])


# ------------------------------------------------------------------ (d) a whole training run
# A small LR without warmup, over 8 steps: at the tiny config's LR 0.01 with warmup, 16 steps
# amplify rounding differences into 1% of the conv weights and 3e-4 of the metric, for two
# unsplit runs with 1 and 2 threads alike (seen on the 2-core AMD EPYC), as the split and
# unsplit convolutions add in different orders too.
RUN = [
    "--n-train",
    "16",
    "--n-valid",
    "16",
    "--batch-size",
    "4",
    "--n-epochs",
    "2",
    "--deterministic",
    "--set",
    "model.dropout=0.5",
    "--set",
    "train.global_batch_size=4",
    "--set",
    "train.stop_at_target=false",
    "--set",
    "train.checkpoint_every=2",
    "--set",
    "optimizer.warmup_epochs=0",
    "--set",
    "optimizer.base_learning_rate=0.001",
    "--set",
    "target_mae=10",
]  # exit 0 after 2 epochs


def _train(tiny_config, data, out, ranks, *extra):
    cmd = helpers.train_cmd(
        "cosmoflow", tiny_config, "--data-dir", data, "--output-dir", out, *RUN, *extra
    )
    return helpers.train_to_summary(cmd, ranks, out)


@pytest.fixture(scope="module")
def split_run(cosmo_data, tiny_config, tmp_path_factory):
    """The 2-rank, 2-way split run both tests below compare with (run once)."""
    out = tmp_path_factory.mktemp("split") / "run"
    proc, summary = _train(tiny_config, cosmo_data, out, 2, "--spatial-ranks", "2")
    return proc, summary, out


def test_spatial_run_ends_as_the_one_rank_run(cosmo_data, tiny_config, tmp_path, split_run):
    _, one = _train(tiny_config, cosmo_data, tmp_path / "one", 1)
    proc, split, split_dir = split_run
    assert "2-way spatial x 1 data-parallel group(s)" in proc.stdout
    # Its group of 2 is the job: Horovod's global set, a plain hvd.init() (4 ranks: test_init_order).
    assert "process sets" not in proc.stdout
    log = (split_dir / "mlperf.log").read_text()
    assert '"key": "global_batch_size", "value": 4' in log
    assert len(one["history"]) == len(split["history"]) == 2
    for a, b in zip(one["history"], split["history"]):
        assert abs(a["loss"] - b["loss"]) <= 1e-4 * abs(a["loss"]), (a, b)
        assert abs(a["metric"] - b["metric"]) <= 1e-4 * abs(a["metric"]), (a, b)
    want, got = (
        helpers.final_model_weights(tmp_path / "one"),
        helpers.final_model_weights(split_dir),
    )
    assert want.keys() == got.keys()
    for name, value in want.items():
        assert _relative_error(got[name], value) <= 1e-4, name
    assert split["weights_in_sync"]


def test_staged_slabs_hold_one_rank_s_planes_and_train_the_same(
    cosmo_data, tiny_config, tmp_path, split_run
):
    import tensorflow as tf

    _, unstaged, _ = split_run
    stage = tmp_path / "stage"
    _, staged = _train(
        tiny_config,
        cosmo_data,
        tmp_path / "staged",
        2,
        "--spatial-ranks",
        "2",
        "--stage-dir",
        stage,
    )
    assert [h["loss"] for h in staged["history"]] == [h["loss"] for h in unstaged["history"]]
    slabs = sorted((stage / "train").glob("*.slab0of2")) + sorted(
        (stage / "train").glob("*.slab1of2")
    )
    assert len(slabs) == 2 * 16
    # A staged slab is its rank's planes of the source sample, uncompressed.
    from cosmoflow.data import parse_example

    source = cosmo_data / "train" / slabs[0].name.replace(".slab0of2", "")
    whole, y = parse_example(
        next(iter(tf.data.TFRecordDataset(str(source), "GZIP"))), (32, 32, 32, 4)
    )
    half, y_half = parse_example(
        next(iter(tf.data.TFRecordDataset(str(slabs[0])))), (16, 32, 32, 4)
    )
    np.testing.assert_array_equal(half.numpy(), whole.numpy()[:16])
    np.testing.assert_array_equal(y_half.numpy(), y.numpy())
    assert slabs[0].stat().st_size < 0.55 * 32**3 * 4 * 2


# ------------------------------------------------------------------ (f) bad K
@pytest.mark.parametrize(
    "bench,args,says",
    [
        (
            "cosmoflow",
            ["--spatial-ranks", "2"],
            "parallel.spatial_ranks=2 does not divide the 1 ranks",
        ),
        ("cosmoflow", ["--spatial-ranks", "32"], "at most 16 spatial ranks"),
        ("cosmoflow", ["--spatial-ranks", "3"], "does not divide the sample depth 32"),
        (
            "cosmoflow",
            [
                "--spatial-ranks",
                "2",
                "--stage-dir",
                "/tmp/unused",
                "--set",
                "staging.convert=false",
            ],
            "would have the ranks of a group write the same staged file",
        ),
        (
            "deepcam",
            ["--spatial_ranks", "3"],
            "the height 64 must be a multiple of 3 x the output stride 16",
        ),
        (
            "deepcam",
            ["--spatial_ranks", "2", "--stage_dir", "/tmp/unused"],
            "staging is not implemented for a height split",
        ),
    ],
)
def test_a_spatial_split_that_cannot_work_is_one_line_error(
    cosmo_data, tiny_config, deepcam_data, deepcam_config, tmp_path, bench, args, says
):
    config, data = (
        (tiny_config, cosmo_data) if bench == "cosmoflow" else (deepcam_config, deepcam_data)
    )
    paths = ["--set", f"data.data_dir={data}", "--set", f"output_dir={tmp_path / 'run'}"]
    proc = helpers.run(helpers.train_cmd(bench, config, *paths, *args))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], proc.stderr[-2000:]


@pytest.mark.parametrize(
    "bench,batch_key,batch,ranks,config",
    [
        ("cosmoflow", "data.batch_size", "4", 256, "cosmoflow_closed_gbs512.yaml"),
        ("deepcam", "data.local_batch_size", "2", 256, "deepcam_closed_gbs256.yaml"),
    ],
)
def test_a_closed_config_takes_rcp_ranks_times_the_spatial_ranks(
    bench, batch_key, batch, ranks, config
):
    from common.benchmarks import closed_config_for, task_class

    task = task_class(bench)
    assert closed_config_for(
        task, {batch_key: batch, "parallel.spatial_ranks": "2"}, ranks=ranks
    ).endswith(config)
    # The same global batch unsplit: half the ranks.
    assert closed_config_for(task, {batch_key: batch}, ranks=ranks // 2).endswith(config)


# ------------------------------------------------------------------ figures
def test_benchmark_mode_counts_groups_not_ranks(cosmo_data, tiny_config, tmp_path):
    out = tmp_path / "bench"
    cmd = helpers.train_cmd(
        "cosmoflow",
        tiny_config,
        "--data-dir",
        cosmo_data,
        "--output-dir",
        out,
        "--n-train",
        "16",
        "--n-valid",
        "8",
        "--batch-size",
        "2",
        "--benchmark",
        "2",
        "--spatial-ranks",
        "2",
        "--set",
        "train.benchmark_warmup_steps=1",
    )
    proc = helpers.horovodrun(2, cmd)
    assert proc.returncode == 0, helpers.failure_output(proc)
    b = json.loads((out / "summary.json").read_text())["throughput"]
    assert b["spatial_ranks"] == 2 and b["global_batch_size"] == 2
    # One group of 2 ranks trains 2 samples a step: the job's rate is one group's.
    assert b["samples_per_s"] == pytest.approx(2 * b["steps"] / b["seconds"])
    assert b["samples_per_s_per_rank"] == pytest.approx(b["samples_per_s"] / 2)


@pytest.mark.slow  # the bench script's own test: bench/ tooling, not the training path
def test_spatial_bench_reports_memory_and_halo_bytes(tmp_path):
    proc = helpers.run(
        [
            helpers.PYTHON,
            helpers.REPO / "bench" / "spatial.py",
            "--configs",
            "cosmoflow/configs/cosmoflow_closed_gbs512.yaml",
            "--set",
            "data.sample_shape=32,32,32,4",
            "--ks",
            "1,2",
            "--halo-overlap",
            "on",
            "--steps",
            "1",
            "--allow-load",
            "--out-dir",
            tmp_path,
        ],
        timeout=900,
    )
    assert proc.returncode == 0, helpers.failure_output(proc)
    rows = json.loads(next(tmp_path.glob("spatial_*.json")).read_text())["rows"]
    one, two = rows
    assert (one["spatial_ranks"], two["spatial_ranks"]) == (1, 2) and one[
        "halo_mib_forward_per_rank"
    ] == 0
    # Split conv layers at 32^3, K=2 (the closed model's 5 layers, 32..512 filters): the slab keeps its
    # planes through pool4, then is gathered; each sends 2 planes of its input forward, and again
    # backward but for conv1 (its input, the sample, needs no gradient): 5 + 4 alltoalls in the timeline.
    planes = [(32, 4), (16, 32), (8, 64), (4, 128), (2, 256)]
    expected = sum(2 * edge * edge * channels * 4 for edge, channels in planes)
    assert two["halo_mib_forward_per_rank"] * 2**20 == pytest.approx(expected)
    # conv1-3 (slabs of 16, 8, 4 planes) overlap; conv4 and conv5 (2, 1) have no interior.
    assert (
        two["halo_exchanges_forward"],
        two["alltoalls_per_step"],
        two["overlapping_layers"],
    ) == (5, 9, 3)
    assert 0 < two["halo_transfer_share"] <= two["halo_in_flight_share"] <= 1, two
    held = two["replicated_gib"]  # fp32 weights, and the head after the gather
    assert held["weights"] * 2**30 >= 4 * two["parameters"] and held["gathered_activations"] > 0
    assert two["samples_per_s"] > 0 and two["peak_rss_gib_per_rank"] > 0
    assert two["speed_vs_unsplit"] == pytest.approx(two["samples_per_s"] / one["samples_per_s"])
    table = next(tmp_path.glob("spatial_*.md")).read_text()
    assert "| cosmoflow | 32^3 | 2 | overlapped |" in table and "Load average per core" in table
    from bench.spatial import fusion_buffer

    assert f"its fusion buffer {fusion_buffer(helpers.env())};" in table


def test_staging_a_corrupt_file_into_slabs_names_it(tmp_path):
    from common.errors import InputError
    from cosmoflow.prepare import slab_conversion

    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(b"\x1f\x8b" + b"\x00" * 100)  # a gzip magic, then garbage
    with pytest.raises(InputError, match="bad.tfrecord: unreadable TFRecord"):
        slab_conversion(0, 2, (32, 32, 32, 4)).write(bad, tmp_path / "out", False)
