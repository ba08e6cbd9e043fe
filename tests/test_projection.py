"""The scaling projection (offline/projection/): each term against
hand-computed cases on a made-up machine, the RCP epochs against mlperf_logging's own RCP
checker, the shipped machine files and stored model costs, and the validation against published
MLPerf HPC results (offline/published_points.yaml, the v3.0 logs of tests/fixtures).

No TensorFlow: the model costs are read from offline/model_costs/*.json.
"""

import dataclasses
import json
import statistics
import tarfile

import pytest

from common.errors import InputError
from offline.projection import (
    cli,
    height_report,
    height_split,
    inputs,
    model,
    published_points,
    questions,
    rcp,
    spatial,
)
from offline.projection.model import Dataset, Machine, ModelCosts
from tests import helpers

FIXTURES = helpers.REPO / "tests" / "fixtures" / "hpc_results_v3.0.tar.gz"

# A made-up machine whose every figure is a round number, so each term is checkable by hand.
TOY = Machine(
    name="toy",
    device="toy accelerator",
    peak_flop_per_s={"fp32": 1e12, "fp16": 4e12},
    memory_bytes_per_s=1e11,
    devices_per_node=2,
    cores_per_node=8,
    nic_bytes_per_s=10e9,
    nic_latency_s=1e-6,
    intra_node_bytes_per_s=50e9,
    filesystem_bytes_per_s=1e10,
    node_local_write_bytes_per_s=1e9,
    precision="fp16",
    efficiency={"default": 0.5},
)
# Per training sample: 3 GFLOP, 0.6 GB of float32 activation traffic (0.3 GB in fp16); 0.3 GB of
# weight traffic per step; 0.1 GB of gradients; forward 1 GFLOP and 0.2 GB.
COSTS = ModelCosts(
    flops_train=3e9,
    flops_forward=1e9,
    activation_bytes_train=6e8,
    activation_bytes_forward=2e8,
    weight_bytes_train=3e8,
    gradient_bytes=1e8,
    input_samples_per_s_per_core=10.0,
)
DATA = Dataset(train_samples=1000, eval_samples=100, bytes=1e11)


# ------------------------------------------------------------------ each term, by hand
def test_compute_and_memory_terms():
    # compute: 4 samples x 3e9 FLOP / 4e12 FLOP/s (fp16)
    assert model.compute_seconds(TOY, COSTS, 4, "fp16") == pytest.approx(3e-3)
    assert model.compute_seconds(TOY, COSTS, 4, "fp32") == pytest.approx(12e-3)
    # memory: (4 x 6e8 x 2/4 + 3e8) B / 1e11 B/s: activations halve in fp16, weights do not
    assert model.memory_seconds(TOY, COSTS, 4, "fp16") == pytest.approx(0.015)
    assert model.memory_seconds(TOY, COSTS, 4, "fp32") == pytest.approx(0.027)


def test_ring_allreduce():
    # 2 nodes x 2 devices, p = 4: 2 (3/4) x 1e8 B / (10e9 / 2 B/s per device) + 2 x 3 x 1 us
    assert model.allreduce_seconds(TOY, 1e8, 2) == pytest.approx(0.03 + 6e-6)
    # one node: the intra-node link, p = 2: 2 (1/2) x 1e8 / 50e9 + 2 x 1 x 1 us
    assert model.allreduce_seconds(TOY, 1e8, 1) == pytest.approx(0.002 + 2e-6)
    # one device: nothing to reduce
    single = dataclasses.replace(TOY, devices_per_node=1)
    assert model.allreduce_seconds(single, 1e8, 1) == 0.0


def test_staging_term():
    # 2 nodes write 2 GB/s, below the file system's 10 GB/s: 1e11 / 2e9
    assert model.staging_seconds(TOY, DATA, 2) == pytest.approx(50.0)
    # 20 nodes could write 20 GB/s: the file system limits it, 1e11 / 1e10
    assert model.staging_seconds(TOY, DATA, 20) == pytest.approx(10.0)
    # 4 jobs at once share the file system: 1e11 / 2.5e9
    assert model.staging_seconds(TOY, DATA, 20, instances=4) == pytest.approx(40.0)
    assert model.staging_saturation_nodes(TOY) == pytest.approx(10.0)
    assert model.staging_saturation_nodes(TOY, instances=4) == pytest.approx(2.5)
    # an unknown file system limits nothing; with both rates unknown staging cannot be projected
    no_fs = dataclasses.replace(TOY, filesystem_bytes_per_s=None)
    assert model.staging_seconds(no_fs, DATA, 20) == pytest.approx(5.0)
    assert model.staging_saturation_nodes(no_fs) is None
    unknown = dataclasses.replace(no_fs, node_local_write_bytes_per_s=None)
    assert model.staging_seconds(unknown, DATA, 20) is None
    with pytest.raises(ValueError, match="staging cannot be projected"):
        model.project(unknown, COSTS, DATA, "bench", 2, 16, 3.0)
    assert (
        model.project(unknown, COSTS, DATA, "bench", 2, 16, 3.0, staging_timed=False).staging_s
        is None
    )


def test_eval_term():
    # 4 devices: ceil(100 / 4) = 25 samples each, memory-bound: 2e8 x 2/4 B / 1e11 B/s = 1 ms, / 0.5
    assert model.eval_seconds(TOY, COSTS, DATA, 4, "fp16", 0.5) == pytest.approx(0.05)
    # 3 devices: ceil(100 / 3) = 34
    assert model.eval_seconds(TOY, COSTS, DATA, 3, "fp16", 0.5) == pytest.approx(34 * 2e-3)


def test_total_time_to_train():
    p = model.project(TOY, COSTS, DATA, "bench", nodes=2, global_batch=16, epochs=3.0)
    assert (p.devices, p.local_batch, p.steps_per_epoch) == (4, 4, 62)  # 1000 // 16
    assert p.bound == "memory"
    assert p.device_step_s == pytest.approx(0.015 / 0.5)
    assert p.step_s == pytest.approx(0.03 + 0.030006)  # no overlap
    assert p.train_epoch_s == pytest.approx(62 * 0.060006)
    assert p.eval_epoch_s == pytest.approx(0.05)
    assert p.staging_s == pytest.approx(50.0)
    assert p.time_to_train_s == pytest.approx(50 + 3 * (62 * 0.060006 + 0.05))  # 61.311116 s
    parts = p.parts_s()
    assert parts == pytest.approx(
        {"compute": 3 * 62 * 0.03, "allreduce": 3 * 62 * 0.030006, "staging": 50.0, "eval": 0.15}
    )
    assert sum(parts.values()) == pytest.approx(p.time_to_train_s)
    assert sum(p.shares().values()) == pytest.approx(1.0)
    # 8 cores x 10 samples/s against 2 devices x 4 samples per 0.060006 s
    assert p.input_headroom == pytest.approx(80 / (8 / 0.060006))
    # staging outside the timed region, half of the allreduce hidden, no RCP
    untimed = model.project(TOY, COSTS, DATA, "bench", 2, 16, 3.0, staging_timed=False)
    assert untimed.time_to_train_s == pytest.approx(3 * (62 * 0.060006 + 0.05))
    overlapped = dataclasses.replace(TOY, allreduce_overlap=0.5)
    assert model.project(overlapped, COSTS, DATA, "bench", 2, 16, 3.0).step_s == pytest.approx(
        0.03 + 0.015003
    )
    assert model.project(TOY, COSTS, DATA, "bench", 2, 16, None).time_to_train_s is None
    with pytest.raises(ValueError, match="smaller than the 4 devices"):
        model.project(TOY, COSTS, DATA, "bench", 2, 2, 3.0)


def test_calibration_inverts_the_projection():
    published = model.project(TOY, COSTS, DATA, "bench", 2, 16, 3.0).time_to_train_s
    untouched = TOY.with_efficiency("bench", 0.9)  # calibration ignores the stated efficiency
    assert published_points.calibrate_efficiency(
        untouched, COSTS, DATA, "bench", 2, 16, 3.0, published
    ) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="exceed the published"):
        # staging (50 s) and the allreduce (3 x 62 x 30.006 ms = 5.58 s) alone take longer than 55 s
        published_points.calibrate_efficiency(TOY, COSTS, DATA, "bench", 2, 16, 3.0, 55.0)


def test_questions_users_ask():
    # memory-bound at every batch: 3e9/4e12 = 0.75 ms of compute < 3 ms of traffic per sample
    assert questions.smallest_compute_bound_local_batch(TOY, COSTS) is None
    # 10x the FLOPs and weights: b x 7.5 ms >= (b x 3 ms + 30 ms) from b = 30 / 4.5 -> 7
    heavy = dataclasses.replace(COSTS, flops_train=3e10, weight_bytes_train=3e9)
    assert questions.smallest_compute_bound_local_batch(TOY, heavy) == 7
    # busy 90%: device 6 ms x (b + 1) >= 9 x 30.006 ms of allreduce -> b = 45 at 2 nodes
    assert questions.smallest_busy_local_batch(TOY, COSTS, "bench", nodes=2, busy=0.9) == 45
    # staging 10 s whatever the nodes (a 1 GB/s file system); 6 epochs of batch 64 shrink with the
    # nodes: 18.6 s on 1 node (35% staging), 12.2 s on 2 (45%), 8.2 s on 4 (55%): dominant from 4
    slow_fs = dataclasses.replace(TOY, filesystem_bytes_per_s=1e9)
    small = Dataset(train_samples=1000, eval_samples=100, bytes=1e10)
    assert questions.staging_dominates_from(
        slow_fs, COSTS, small, "bench", lambda n: 64, lambda b: 6.0, max_nodes=32
    ) == (4, 4)
    # no RCP anywhere: nothing checked
    assert questions.staging_dominates_from(
        slow_fs, COSTS, small, "bench", lambda n: 64, lambda b: None, max_nodes=32
    ) == (None, None)


# ------------------------------------------------------------------ RCP epochs
def test_rcp_olympic_mean_and_interpolation():
    records = {
        "r32": {"BS": 32, "Epochs to converge": [8, 5, 7, 6]},  # olympic mean (6 + 7) / 2
        "r128": {"BS": 128, "Epochs to converge": [10, 11, 12]},
    }  # 11
    means = rcp.olympic_means(records)
    assert means == {32: 6.5, 128: 11.0}
    assert rcp.rcp_epochs(means, 32) == 6.5
    assert rcp.rcp_epochs(means, 64) == pytest.approx(6.5 + 4.5 * 32 / 96)
    assert rcp.rcp_epochs(means, 16) is None
    assert rcp.rcp_epochs(means, 256) is None


@pytest.mark.parametrize("benchmark", ["cosmoflow", "deepcam"])
def test_rcp_epochs_match_the_rcp_checker(benchmark):
    """Our means, pruning and interpolation against mlperf_logging's RCP_Checker on the real tables."""
    from mlperf_logging.rcp_checker.rcp_checker import RCP_Checker

    checker = RCP_Checker("hpc", "3.0.0", benchmark, False)
    means = rcp.rcp_means(benchmark)
    assert means == pytest.approx({r["BS"]: r["RCP Mean"] for r in checker.rcp_data.values()})
    pruned = rcp.rcp_means(benchmark, rcp_pass="pruned")
    assert sorted(pruned) == sorted(r["BS"] for r in checker.pruned_rcp_data.values())
    for bs in range(min(pruned) + 16, max(pruned), 48):
        low, high = (
            checker._find_top_min_rcp(bs, "pruned_rcps"),
            checker._find_bottom_max_rcp(bs, "pruned_rcps"),
        )
        expected = (
            checker._find_rcp(bs, "pruned_rcps") or checker._create_interp_rcp(bs, low, high)[1]
        )
        assert rcp.rcp_epochs(pruned, bs) == pytest.approx(expected["RCP Mean"])


# ------------------------------------------------------------------ shipped data
def test_stored_model_costs_are_the_closed_models():
    cosmo, deepcam = inputs.stored_costs("cosmoflow"), inputs.stored_costs("deepcam")
    assert (cosmo["parameters"], deepcam["parameters"]) == (8_907_556, 56_454_720)
    # the five Conv3D layers, 2 x outputs x 27 x input channels each, are all but 0.5% of the forward
    convs = sum(
        2 * (128 >> i) ** 3 * (32 << i) * 27 * (4 if i == 0 else 32 << (i - 1)) for i in range(5)
    )
    assert convs == 68_853_694_464
    assert cosmo["flops_per_sample_forward"] == pytest.approx(convs, rel=0.005)
    for record in (cosmo, deepcam):
        assert record["flops_per_sample_train"] == 3 * record["flops_per_sample_forward"]
        assert {"cpu", "isa", "tensorflow", "command"} <= set(record["measured_on"])


@pytest.mark.parametrize(
    "path", sorted((helpers.REPO / "machines").glob("*.yaml")), ids=lambda p: p.stem
)
def test_every_machine_file_loads(path):
    machine = inputs.load_machine(path)
    assert machine.peak(machine.precision) > 0
    assert path.read_text().startswith("#")  # the command and the sources come first


def test_machine_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((helpers.REPO / "machines" / "perlmutter-a100.yaml").read_text() + "gpus: 4\n")
    with pytest.raises(InputError, match="unknown keys gpus"):
        inputs.load_machine(bad)
    bad.write_text("name: x\n")
    with pytest.raises(InputError, match="missing keys"):
        inputs.load_machine(bad)


# ------------------------------------------------------------------ validation against published results
@pytest.fixture(scope="module")
def points():
    return inputs.load_points()


def test_each_machine_states_its_calibrated_efficiency(points):
    calibration = {name: p for name, p in points.items() if p["role"] == "calibration"}
    devices = [inputs.load_machine(p["machine"]).device for p in calibration.values()]
    assert len(devices) == len(set(devices)), "one calibration point per device type"
    for name, point in calibration.items():
        machine = inputs.load_machine(point["machine"])
        assert machine.efficiency_for(point["benchmark"]) == pytest.approx(
            published_points.calibrate(name, points), abs=1e-4
        )
    # a validation-only machine of a calibrated device type states that device's efficiency
    clemson = inputs.load_machine("clemson-a100-pcie")
    assert clemson.efficiency_for("deepcam") == pytest.approx(
        published_points.calibrate("perlmutter-cosmoflow-128", points), abs=1e-4
    )


def test_validation_points_within_25_percent_or_explained(points):
    validation = [name for name, p in points.items() if p["role"] == "validation"]
    assert len(validation) >= 5
    for name in validation:
        point = points[name]
        assert (
            point["calibrated_by"] != name
            and points[point["calibrated_by"]]["role"] == "calibration"
        )
        check = published_points.check_point(name, points)
        assert check.error is not None, f"{name}: no RCP for its global batch"
        if not check.within:
            reason = point.get("outside_because", "")
            assert reason.startswith(f"{check.dominant}:"), (
                f"{name}: {check.error:+.0%}, dominated by {check.dominant}; outside_because says {reason[:40]!r}"
            )


@pytest.fixture(scope="module")
def fixture_logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fixtures")
    with tarfile.open(FIXTURES) as tar:
        tar.extractall(root)
    return root / "hpc_results_v3.0"


def _events(path) -> dict:
    events = {}
    for line in path.read_text().splitlines():
        if line.startswith(":::MLLOG "):
            entry = json.loads(line[len(":::MLLOG ") :])
            events.setdefault(entry["key"], []).append(entry)
    return events


def test_fixture_points_match_their_logs(points, fixture_logs):
    """The published figures of the fixture points, recomputed from the v3.0 logs themselves."""

    def runs(folder):
        return [_events(p) for p in sorted((fixture_logs / folder).glob("result_*.txt"))]

    def minutes(e):
        return (e["run_stop"][0]["time_ms"] - e["run_start"][0]["time_ms"]) / 60000

    cosmo = runs("HPE+LBNL/results/perlmutter_128x4/strong/cosmoflow")
    times = sorted(minutes(e) for e in cosmo)
    point = points["perlmutter-cosmoflow-128"]
    assert statistics.mean(times[1:-1]) == pytest.approx(
        point["published_minutes"], abs=1e-5
    )  # olympic mean
    assert {e["eval_error"][-1]["metadata"]["epoch_num"] for e in cosmo} == {point["logged_epochs"]}
    staging = [
        (e["staging_stop"][0]["time_ms"] - e["staging_start"][0]["time_ms"]) / 1000 for e in cosmo
    ]
    assert statistics.mean(staging) == pytest.approx(point["logged_staging_s"], abs=1e-3)
    # staging is timed: it starts after run_start
    assert all(e["staging_start"][0]["time_ms"] >= e["run_start"][0]["time_ms"] for e in cosmo)

    weak = runs("HPE+LBNL/results/perlmutter_10x128x4_ngc21.09_pytorch/weak/deepcam")
    point = points["perlmutter-deepcam-128-weak"]
    assert len(weak) == point["instances"]
    assert statistics.mean(minutes(e) for e in weak) == pytest.approx(
        point["published_minutes"], abs=1e-5
    )
    assert (
        statistics.mean(e["eval_accuracy"][-1]["metadata"]["epoch_num"] for e in weak)
        == point["logged_epochs"]
    )

    def epoch_1_excess(e):
        lengths = [
            (b["time_ms"] - a["time_ms"]) / 1000 for a, b in zip(e["epoch_start"], e["epoch_stop"])
        ]
        return lengths[0] - statistics.median(lengths[1:])

    assert statistics.mean(epoch_1_excess(e) for e in weak) == pytest.approx(
        point["logged_staging_s"], abs=0.01
    )


# ------------------------------------------------------------------ the command
@pytest.mark.parametrize("benchmark", ["cosmoflow", "deepcam"])
def test_command_prints_every_term_and_writes_the_figure(benchmark, tmp_path, capsys):
    png = tmp_path / "curves.png"
    rc = cli.main(
        [
            "--benchmark",
            benchmark,
            "--machine",
            "machines/perlmutter-a100.yaml",
            "--nodes",
            "16,32,64,128,256",
            "--png",
            str(png),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    for words in (
        "global",
        "local",
        "epochs",
        "staging",
        "allreduce",
        "eval/epoch",
        "headroom",
        "time to train",
        "where the time goes",
        "limits it beyond",
        "local batch",
        "measured with TensorFlow",
    ):
        assert words in out
    # cosmoflow: 256 nodes x 4 devices x local batch 4 = 4096 is past the table's 1024; deepcam's 2048 is in it
    assert ("no RCP" in out) == (benchmark == "cosmoflow")
    assert png.stat().st_size > 10_000


def test_command_refuses_what_it_cannot_project(tmp_path, capsys):
    args = [
        "--benchmark",
        "deepcam",
        "--machine",
        "clemson-a100-pcie",
        "--nodes",
        "18",
        "--png",
        str(tmp_path / "c.png"),
    ]
    assert cli.main(args) == 2
    assert "--staging untimed" in capsys.readouterr().err
    assert cli.main(args + ["--staging", "untimed"]) == 0
    assert (
        cli.main(["--benchmark", "deepcam", "--machine", "perlmutter-a100", "--nodes", "a,b"]) == 2
    )


def test_command_takes_a_runs_characterization(tmp_path, capsys):
    """--characterization: the FLOPs, traffic, gradient bytes and input rate of offline.characterize's report."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "characterization.json").write_text(
        json.dumps(
            {
                "flops_per_sample_train": 3e9,
                "memory_bytes_per_sample_train": 6e8,
                "gradient_bytes_per_step": 4e6,
                "input_samples_per_s": 40.0,
                "parameters": 1_000_000,
                "machine": {"cpus": 2},
            }
        )
    )
    costs, line = inputs.load_costs("cosmoflow", run)
    assert (costs.flops_train, costs.flops_forward, costs.gradient_bytes) == (3e9, 1e9, 4e6)
    assert costs.input_samples_per_s_per_core == 20.0
    assert "1,000,000 parameters" in line
    assert (
        cli.main(
            [
                "--benchmark",
                "cosmoflow",
                "--machine",
                "perlmutter-a100",
                "--nodes",
                "4",
                "--characterization",
                str(run),
                "--png",
                str(tmp_path / "p.png"),
            ]
        )
        == 0
    )
    assert "3.0 GFLOP" in capsys.readouterr().out
    assert (
        cli.main(
            [
                "--benchmark",
                "cosmoflow",
                "--machine",
                "perlmutter-a100",
                "--nodes",
                "4",
                "--characterization",
                str(tmp_path),
            ]
        )
        == 2
    )


# ------------------------------------------------------------------ spatial parallelism (offline/projection/spatial.py)
def test_layer_rebuild_is_the_measured_closed_model():
    """The 128^3 network rebuilt from its shapes has the stored model's parameters and ~its FLOPs."""
    record = inputs.stored_costs("cosmoflow")
    layers = spatial.network_layers(128)
    assert spatial.parameters(layers) == record["parameters"]
    analytic = sum(layer.forward_flops for layer in layers)
    assert analytic == pytest.approx(record["flops_per_sample_forward"], rel=0.01)
    # 128^3 at K=1 through the spatial path gives back the measured costs
    measured, _ = inputs.load_costs("cosmoflow")
    costs = spatial.device_costs(measured, 128, 1)
    for field in (
        "flops_train",
        "flops_forward",
        "activation_bytes_train",
        "weight_bytes_train",
        "gradient_bytes",
    ):
        assert getattr(costs, field) == pytest.approx(getattr(measured, field), rel=1e-12)


def test_halo_bytes_against_the_slabs_a_rank_sends():
    """Per split conv: the bytes of the tensor neighbour_planes sends (the slab's first and last h planes),
    built here from the layer shapes with numpy; one alltoall forward and one backward."""
    np = pytest.importorskip("numpy")
    for edge, k, precision in ((128, 4, "fp16"), (256, 2, "fp32"), (512, 4, "bf16")):
        channels = [spatial.IN_CHANNELS] + [
            min(32 << i, 512 if edge == 128 else 256) for i in range(spatial.conv_layer_count(edge))
        ]
        dtype = np.float16 if model.ELEMENT_BYTES[precision] == 2 else np.float32
        halos = [c for c in spatial.collectives(edge, k, precision) if c.what == "halo"]
        assert len(halos) == spatial.conv_layer_count(
            edge
        )  # every conv split (gather before flatten)
        for i, c in enumerate(halos):
            y = edge >> i
            slab = np.zeros((edge // k >> i, y, y, channels[i]), dtype)
            sent = np.concatenate([slab[:1], slab[-1:]])  # h = 1 plane to each neighbour
            assert c.forward_bytes == c.backward_bytes == sent.nbytes
            assert c.count == 2


def test_exchange_seconds_by_hand():
    """K=2 at 128^3, fp32, one sample per group: bytes over the NVLink share plus a cycle per collective."""
    machine = inputs.load_machine("perlmutter-a100")
    link = machine.intra_node_bytes_per_s
    halo = sum(
        2 * 2 * (128 >> i) ** 2 * c * 4 for i, c in enumerate((4, 32, 64, 128, 256))
    )  # fwd + bwd
    gathered = 4 * 4 * 4 * 512 * 4  # the 4^3 x 512 tensor before Flatten
    gather = (
        0.5 + 2 * 0.5
    ) * gathered  # allgather (K-1)/K forward, ring allreduce 2 (K-1)/K backward
    expected = (halo + gather) / link + (2 * 5 + 3) * 1e-3
    assert spatial.exchange_seconds(machine, 128, 2, "fp32", 1) == pytest.approx(expected)
    assert spatial.exchange_seconds(machine, 128, 1, "fp32", 1) == 0.0


@pytest.mark.parametrize(
    "machine_name,k,boundaries,halos_across",
    [
        ("perlmutter-a100", 4, [], 0),  # on one node
        ("perlmutter-a100", 8, [4], 1),  # 2 nodes: ranks 3 and 4 each send one halo off their node
        ("perlmutter-a100", 16, [4, 8, 12], 1),
        ("fugaku-a64fx", 2, [1], 1),  # one device per node: every boundary joins two nodes
        ("fugaku-a64fx", 4, [1, 2, 3], 2),
    ],
)
def test_the_slab_boundaries_that_cross_the_network(machine_name, k, boundaries, halos_across):
    links = spatial.group_links(inputs.load_machine(machine_name), k)
    assert links.crossing_boundaries() == boundaries
    assert len(boundaries) == max(links.nodes - 1, 0) and links.halos_across == halos_across


def test_exchange_seconds_over_two_nodes_by_hand():
    """K=8 on 4-GPU nodes at 128^3, fp32, one sample: the slowest rank sends one of its two halos over
    its share of the NIC (100 / 4 GB/s) plus the NIC's latency per alltoall; the gather's rings join
    the nodes, so they go at the NIC's share with its latency per ring step."""
    machine = inputs.load_machine("perlmutter-a100")
    intra, net, lat = (
        machine.intra_node_bytes_per_s,
        machine.nic_bytes_per_s / 4,
        machine.nic_latency_s,
    )
    one_halo = [
        (128 >> i) ** 2 * c * 4 for i, c in enumerate((4, 32, 64, 128, 256))
    ]  # slabs of 16, 8, 4, 2, 1
    halo = sum(
        2 * (h / intra + h / net) + 2 * 1e-3 + 2 * lat for h in one_halo
    )  # forward + backward
    gathered = 8**3 * 512 * 4  # before pool5: a slab of conv5 is 1 plane
    gather = (7 / 8 + 2 * 7 / 8) * gathered / net + 3 * 1e-3 + 4 * 7 * lat
    assert spatial.exchange_seconds(machine, 128, 8, "fp32", 1) == pytest.approx(halo + gather)
    # The same group without the network (node-local links everywhere) is faster: the NIC is what costs.
    local = dataclasses.replace(spatial.group_links(machine, 8), nodes=1)
    assert (
        sum(c.seconds(local, 1, 1e-3) for c in spatial.collectives(128, 8, "fp32")) < halo + gather
    )


def test_exchange_seconds_one_device_per_node_by_hand():
    """Fugaku, K=4: every boundary crosses, so the inner ranks send both halos over the NIC."""
    machine = inputs.load_machine("fugaku-a64fx")
    net, lat = machine.nic_bytes_per_s, machine.nic_latency_s
    halo = sum(
        2 * 2 * (128 >> i) ** 2 * c * 4 / net + 2 * 1e-3 + 2 * lat
        for i, c in enumerate((4, 32, 64, 128, 256))
    )
    gather = (3 / 4 + 2 * 3 / 4) * 4**3 * 512 * 4 / net + 3 * 1e-3 + 4 * 3 * lat
    assert spatial.exchange_seconds(machine, 128, 4, "fp32", 1) == pytest.approx(halo + gather)


@pytest.mark.parametrize("k", [4, 16])
def test_fugaku_splits_across_nodes(k, tmp_path, capsys):
    """One device per node: a group of K spans K nodes, and every row whose nodes hold whole groups projects."""
    rc = cli.main(
        [
            "--benchmark",
            "cosmoflow",
            "--machine",
            "fugaku-a64fx",
            "--spatial-ranks",
            str(k),
            "--nodes",
            "8,512,1024",
            "--png",
            str(tmp_path / "f.png"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert (
        f"a group of {k} devices spans {k} nodes: {k - 1} of its {k - 1} slab boundaries (all of them) "
        f"cross the network, each at the device's share of the NIC, 68 GB/s"
    ) in out
    assert "over the intra-node link" not in out  # a node holds one device
    table = out[out.index(f"{k}-way spatial x data parallel") :]
    rows = {
        line.split()[0]: line
        for line in table[: table.index("where the time goes")].splitlines()
        if line[:6].strip().isdigit()
    }
    # 8 nodes hold two groups of 4 but no group of 16: that row alone is refused.
    assert ("the 8 device(s) of 8 node(s) make no whole groups of 16" in rows["8"]) == (k == 16)
    assert "min" in rows["512"] and "min" in rows["1024"]  # a time to train
    assert f"512 nodes at K={k} vs {512 // k} at K=1" in out


def test_a_group_over_4_gpu_nodes_names_the_boundaries_that_cross(tmp_path, capsys):
    rc = cli.main(
        [
            "--benchmark",
            "cosmoflow",
            "--machine",
            "perlmutter-a100",
            "--spatial-ranks",
            "16",
            "--global-batch",
            "512",
            "--nodes",
            "128,512",
            "--png",
            str(tmp_path / "p.png"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert (
        "over the intra-node link at 300 GB/s; a group of 16 devices spans 4 nodes: 3 of its 15 slab boundaries "
        "(slabs 3|4, 7|8, 11|12, numbered from 0) cross the network"
    ) in out
    assert "plus the NIC's 2 us per message between nodes" in out


@pytest.mark.parametrize("edge", spatial.EDGES)
def test_split_memory_scales_as_one_over_k(edge):
    one = spatial.memory_per_device(edge, 1, "fp32")
    split_parts = []
    for k in (2, 4, 8):
        m = spatial.memory_per_device(edge, k, "fp32")
        split_parts.append(m.split_activations * k)
        assert m.state == one.state  # weights are whole on every device
        # the activations: 1/K of K=1's, plus the halo copies and the small replicated head
        assert (m.total - m.state) / ((one.total - one.state) / k) == pytest.approx(1.0, abs=0.1)
    # the split layers' part x K is the same for K that split the same layers (2 and 4: all of them;
    # at 8 a slab is down to 1 plane before the last pool, gathered there)
    assert split_parts[0] == pytest.approx(split_parts[1])
    assert split_parts[2] < split_parts[1]


def test_512_cubed_fits_only_split():
    """One 512^3 sample at K=1 does not fit an 80 GB device in fp32 (nor a 40 GB one in fp16); K=4 fits both."""
    eos, perlmutter = inputs.load_machine("eos-h100"), inputs.load_machine("perlmutter-a100")
    assert not spatial.memory_per_device(512, 1, "fp32").fits(eos.device_memory_bytes)
    assert spatial.memory_per_device(512, 4, "fp32").fits(eos.device_memory_bytes)
    assert not spatial.memory_per_device(512, 1, "fp16").fits(perlmutter.device_memory_bytes)
    assert spatial.memory_per_device(512, 4, "fp16").fits(perlmutter.device_memory_bytes)
    assert spatial.memory_per_device(128, 1, "fp32").fits(perlmutter.device_memory_bytes)


def test_split_projects_past_the_batch_limit():
    """Global batch 512 on 512 nodes x 4 devices: K=1 cannot (fewer samples than devices); K=4 can,
    with the RCP epochs of batch 512."""
    machine = inputs.load_machine("perlmutter-a100")
    measured, _ = inputs.load_costs("cosmoflow")
    means = rcp.rcp_means("cosmoflow")
    with pytest.raises(ValueError, match="smaller than the 2048 devices"):
        model.project(
            machine, measured, inputs.DATASETS["cosmoflow"], "cosmoflow", 512, 512, means[512]
        )
    p = model.project(
        machine,
        spatial.device_costs(measured, 128, 4),
        inputs.DATASETS["cosmoflow"],
        "cosmoflow",
        512,
        512,
        means[512],
        spatial_ranks=4,
        exchange_s_for=lambda b: spatial.exchange_seconds(machine, 128, 4, "fp16", b),
    )
    assert (p.devices, p.groups, p.local_batch, p.epochs) == (2048, 512, 1, means[512])
    assert p.step_s == pytest.approx(p.device_step_s + p.exchange_s + p.allreduce_s)
    assert set(p.shares()) == set(model.COMPONENTS) | {"exchange"}


def test_k1_output_unchanged(tmp_path, capsys):
    """--spatial-ranks 1 is today's projection, line for line; the new Projection fields default to it."""
    args = ["--benchmark", "cosmoflow", "--machine", "perlmutter-a100", "--nodes", "16,128"]
    assert cli.main(args + ["--png", str(tmp_path / "a.png")]) == 0
    plain = capsys.readouterr().out
    assert cli.main(args + ["--spatial-ranks", "1", "--png", str(tmp_path / "a.png")]) == 0
    assert capsys.readouterr().out == plain
    assert "exchange" not in plain and "step: device + allreduce" in plain
    p = model.project(TOY, COSTS, DATA, "toy", 2, 8, 10.0)
    assert (p.spatial_ranks, p.exchange_s, p.groups) == (1, 0.0, 4) and set(p.shares()) == set(
        model.COMPONENTS
    )


def test_split_command_prints_collectives_memory_and_verdicts(tmp_path, capsys):
    png = tmp_path / "split.png"
    rc = cli.main(
        [
            "--benchmark",
            "cosmoflow",
            "--machine",
            "perlmutter-a100",
            "--spatial-ranks",
            "4",
            "--global-batch",
            "512",
            "--nodes",
            "32,128,512",
            "--png",
            str(png),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    for words in (
        "ANALYTIC SCALING",
        "conv1   halo",
        "gather_before_flatten gather",
        "ASSUMPTION",
        "HOROVOD_CYCLE_TIME",
        "memory per device",
        "512^3: one sample needs",
        "splitting is the only way",
        "splitting loses",
        "past the data-parallel limit",
        "step: device + exchange + allreduce",
        "exchange",
    ):
        assert words in out, words
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize(
    "flags",
    [
        ["--benchmark", "deepcam", "--spatial-ranks", "32"],  # 768 / 32 = 24 < 16 x 2
        ["--benchmark", "deepcam", "--spatial-ranks", "2", "--png", "x.png"],
        ["--benchmark", "deepcam", "--sample-edge", "256"],
        ["--benchmark", "cosmoflow", "--spatial-ranks", "3"],
        ["--benchmark", "cosmoflow", "--spatial-ranks", "256", "--machine", "eos-h100"],
    ],
)
def test_bad_split_is_a_one_line_error(flags, capsys):
    machine = [] if "--machine" in flags else ["--machine", "perlmutter-a100"]
    assert cli.main(flags + machine + ["--nodes", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


@pytest.mark.parametrize("k", [3, 6])
def test_a_k_neither_divisor_nor_multiple_of_a_node_s_devices_is_refused(k, capsys):
    assert (
        cli.main(
            [
                "--benchmark",
                "cosmoflow",
                "--machine",
                "perlmutter-a100",
                "--spatial-ranks",
                str(k),
                "--nodes",
                "12",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"error: --spatial-ranks {k} neither divides nor is a multiple of the 4 device(s) per node of Perlmutter"
    )


@pytest.mark.parametrize("edge", [256, 512])
def test_the_projected_large_models_are_the_shipped_spatial_configs(edge):
    import yaml

    cfg = yaml.safe_load(
        (helpers.REPO / "cosmoflow" / "configs" / f"cosmoflow_spatial_{edge}.yaml").read_text()
    )
    assert cfg["data"]["sample_shape"][0] == edge
    assert spatial.conv_layer_count(edge) == cfg["model"]["n_conv_layers"]
    assert spatial.MAX_CHANNELS[edge] == cfg["model"]["max_channels"]


# ------------------------------------------------------------------ DeepCAM split along height (height_split.py)
# tests/test_height_split_rebuild.py holds the rebuilt layers against deepcam.model's (TensorFlow).
def test_height_split_costs_are_the_measured_model_over_k():
    """K=1 gives back the measured costs; every layer computes its rows, so FLOPs are / K (but for the
    pooled branch's 1x1 convolution on every rank), the traffic about / K (the unsplit model's zero
    padding layers are gone, the gathered ASPP input is whole on every rank)."""
    measured, _ = inputs.load_costs("deepcam")
    one = height_split.device_costs(measured, 1)
    for field in (
        "flops_train",
        "flops_forward",
        "activation_bytes_train",
        "weight_bytes_train",
        "gradient_bytes",
    ):
        assert getattr(one, field) == pytest.approx(getattr(measured, field), rel=1e-12)
    for k in (2, 4, 8):
        split = height_split.device_costs(measured, k)
        assert split.flops_train == pytest.approx(measured.flops_train / k, rel=2e-5)
        assert split.gradient_bytes == measured.gradient_bytes
        assert 0.95 / k < split.activation_bytes_train / measured.activation_bytes_train < 1.05 / k
    # analytic: 2 k^2 Cin Cout per output pixel, within 1% of the measured (ASPP padded into tiles there)
    analytic = sum(layer.forward_flops for layer in height_split.network_layers(1))
    assert analytic == pytest.approx(measured.flops_forward, rel=0.01)


def test_height_split_collective_count():
    """K=2: 74 halo layers and 76 batch norms, each one collective forward and one backward, the image
    pooling's 2, the loss's 1. K=4 (12 rows at stride 16): rate 18 reads from the gathered ASPP input
    (allgather, then allreduce and an allgather of sizes backward) instead of its halo."""
    counts = {}
    for k in (2, 4):
        cs = height_split.collectives(k, "fp16")
        counts[k] = {
            what: sum(c.count for c in cs if c.what == what)
            for what in ("halo", "gather", "allreduce")
        }
    assert counts[2] == {"halo": 2 * 74, "gather": 0, "allreduce": 2 * 76 + 2 + 1}
    assert counts[4] == {"halo": 2 * 73, "gather": 3, "allreduce": 2 * 76 + 2 + 1}
    gathered = [c.layer for c in height_split.collectives(4, "fp16") if c.what == "gather"]
    assert gathered == ["xception_features.relu5_gather"]
    assert height_split.collectives(1, "fp16") == []


def test_height_split_halo_term_by_hand():
    """The last transposed convolution at K=2, fp16, on Perlmutter: its input slab is 192 of 384 rows x 576
    x 256; it needs one row from below, exchanged symmetric: 2 x 1 x 576 x 256 x 2 bytes each way, forward
    and backward, over the 300 GB/s link, plus a cycle for each of its 2 alltoalls."""
    machine = inputs.load_machine("perlmutter-a100")
    c = next(c for c in height_split.collectives(2, "fp16") if c.layer == "upsample.last_deconv.0")
    assert (c.what, c.slab, c.forward_bytes, c.backward_bytes, c.count) == (
        "halo",
        (192, 576, 256),
        589_824,
        589_824,
        2,
    )
    links = spatial.group_links(machine, 2)
    assert c.seconds(links, 3, 1e-3) == pytest.approx(3 * 2 * 589_824 / 300e9 + 2e-3)
    # ASPP rate 12 at K=4 (12 rows at stride 16): 12 rows of 72 x 2048 each way
    aspp = next(
        c
        for c in height_split.collectives(4, "fp16")
        if c.layer == "bottleneck.aspp3.atrous_convolution"
    )
    assert aspp.forward_bytes == 2 * 12 * 72 * 2048 * 2
    # batch norm: [mean, mean of squares] of 2048 channels in float32, a ring over 4, whatever the batch
    bn = next(
        c for c in height_split.collectives(4, "fp16") if c.layer == "xception_features.bn5.bn"
    )
    assert bn.forward_bytes == 2 * 3 / 4 * 2 * 2048 * 4 and not bn.per_sample
    assert bn.transfer_s(links, 8) == bn.transfer_s(links, 1)


@pytest.mark.parametrize("k", [2, 4])
def test_deepcam_split_on_one_node(k, capsys):
    rc = cli.main(
        [
            "--benchmark",
            "deepcam",
            "--machine",
            "machines/perlmutter-a100.yaml",
            "--spatial-ranks",
            str(k),
            "--global-batch",
            "2048",
            "--nodes",
            "256,512,1024",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    count = sum(c.count for c in height_split.collectives(k, "fp16"))
    for words in (
        f"split {k} ways along height",
        "56,454,720 parameters, 74 layers reading rows beyond",
        "76 batch-norm layers",
        f"slabs of {768 // k} rows",
        "over the intra-node link at 300 GB/s",
        "xception_features.block4-19.rep.0.conv1      halo    1  16",
        "ASSUMPTION",
        "train.py sets 0.1 ms for a height split",
        f"{k}-way spatial (height)",
        "step: device + exchange + allreduce",
        "per K on Perlmutter",
        "splitting loses",
        "past the data-parallel limit",
        f"a split step waits on {count} collectives",
    ):
        assert words in out, words
    assert ("gathered maps: xception_features.relu5" in out) == (k == 4)
    assert "spans" not in out  # K divides the node's 4 GPUs


def test_deepcam_split_across_nodes(capsys):
    """K=8 on 4-GPU nodes: a group over 2 nodes, its middle boundary over the NIC; the per-K table tells the
    node-local Ks from those across nodes; at the 0.1 ms cycle the split pays from 2 samples per group."""
    rc = cli.main(
        [
            "--benchmark",
            "deepcam",
            "--machine",
            "perlmutter-a100",
            "--spatial-ranks",
            "8",
            "--global-batch",
            "2048",
            "--nodes",
            "1024,2048",
            "--cycle-time-ms",
            "0.1",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert (
        "a group of 8 devices spans 2 nodes: 1 of its 7 slab boundaries (slabs 3|4, numbered from 0) cross "
        "the network"
    ) in out
    table = out[out.index("per K on") :].split("\n\n")[0].splitlines()
    rows = {line.split()[0]: line for line in table[2:]}
    assert sorted(map(int, rows)) == [2, 4, 8, 12, 16, 24, 48]  # 3 and 6 fit no 4-GPU node
    assert (
        "on one node" in rows["4"] and "over 2 nodes" in rows["8"] and "over 12 nodes" in rows["48"]
    )
    assert rows["8"].endswith("local batch 2")
    # The NIC costs: the same 8 devices' collectives as if on one node's links are faster.
    machine = inputs.load_machine("perlmutter-a100")
    local = dataclasses.replace(spatial.group_links(machine, 8), nodes=1)
    on_node = sum(c.seconds(local, 1, 1e-4) for c in height_split.collectives(8, "fp16"))
    assert on_node < height_split.exchange_seconds(machine, 8, "fp16", 1, 1e-4)


def test_deepcam_split_pays_where_the_device_time_dwarfs_the_cycles(capsys):
    """Fugaku (fp32 on a CPU, seconds per sample): a split over nodes wins at once; on Perlmutter at
    Horovod's 1 ms cycle no K=2 batch that fits pays."""
    fugaku = inputs.load_machine("fugaku-a64fx")
    measured, _ = inputs.load_costs("deepcam")
    assert height_report.break_even(fugaku, measured, 4, "fp32", 1e-3)[0] == 1
    perlmutter = inputs.load_machine("perlmutter-a100")
    assert height_report.break_even(perlmutter, measured, 2, "fp16", 1e-3)[0] is None
    assert height_report.break_even(perlmutter, measured, 2, "fp16", 1e-4)[0] == 2


def test_deepcam_split_memory():
    """Activations / K plus the halo copies; the state (weights, gradients, LAMB's 2 slots) whole."""
    one = height_split.memory_per_device(1, "fp16")
    # K=1: the padded inputs of the strided layers (ZeroPadding2D) are its only copies
    assert one.state == 4 * 4 * 56_454_720 and 0 < one.halo_copies < 0.1 * one.split_activations
    for k in (2, 4, 8):
        m = height_split.memory_per_device(k, "fp16")
        assert m.state == one.state and m.split_activations == pytest.approx(
            one.split_activations / k, rel=0.01
        )
        assert 0 < m.halo_copies < m.split_activations
        assert m.total < one.total
