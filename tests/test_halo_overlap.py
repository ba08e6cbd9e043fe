"""The halo exchange overlapped with the interior of a split convolution (parallel.halo_overlap):
a TensorFlow trace of one SpatialConv3D on 2 ranks (tests/halo_overlap_probe.py, in the launch of
tests/two_rank_probes.py), its exchange-first path as the control. That both paths compute the
unsplit function is tests/test_spatial.py's (the layer exactly, the model's step within 1e-5, each
with the halo switched off as the negative control).

Gloo over loopback shares these 2 cores with the convolution, so what the overlap buys in time
is not judged here (bench/spatial.py measures it)."""

import json

import pytest


@pytest.fixture(scope="module")
def traces(two_rank_probe):
    out = two_rank_probe("halo_overlap")
    return {v: json.loads((out / f"{v}.json").read_text()) for v in ("overlap", "exchange-first")}


def test_the_interior_convolution_runs_while_the_alltoall_is_in_flight(traces):
    t = traces["overlap"]
    (sent, arrived), convolutions = t["alltoall"], t["convolutions"]
    assert arrived - sent > 0.5e6, (
        t
    )  # rank 1 came DELAY_S (3 s) late: the exchange was in flight that long
    assert sorted(convolutions) == ["boundary_above", "boundary_below", "interior"], t
    # The interior did not wait for the halo: done before it came (3 s of rank 1's delay), where the
    # control convolves only after it; only the planes next to each neighbour waited for it. Whether
    # it ends after the alltoall's start event is the executor's order: with another test on the
    # cores it once ran first (interior [998, 11490] us, the alltoall's start at 11551 us).
    begin, end = convolutions["interior"]
    assert begin < arrived and end < arrived, t
    assert (
        convolutions["boundary_below"][0] > arrived and convolutions["boundary_above"][0] > arrived
    ), t


def test_exchange_first_convolves_the_slab_after_the_halo_came(traces):
    # The control: the same trace and reading, with the halo exchanged before one convolution.
    t = traces["exchange-first"]
    (sent, arrived), convolutions = t["alltoall"], t["convolutions"]
    assert arrived - sent > 0.5e6, t
    assert len(convolutions) == 1 and all(begin > arrived for begin, _ in convolutions.values()), t


# ------------------------------------------------------------------ bench/spatial.py, without running a step
def test_the_bench_refuses_a_busy_machine_with_one_line(monkeypatch, capsys):
    from bench import machine_load, spatial

    monkeypatch.setattr(
        machine_load.os, "getloadavg", lambda: (3.0 * (machine_load.os.cpu_count() or 1), 0, 0)
    )
    assert spatial.main(["--out-dir", "/nonexistent"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: load average 3.00 per core"), err
    # The same load, allowed (a smoke run), and a quiet machine: no refusal.
    assert machine_load.refusal(allow=True) is None
    monkeypatch.setattr(machine_load.os, "getloadavg", lambda: (0.1, 0, 0))
    assert machine_load.refusal() is None


def test_a_row_waits_for_the_previous_row_s_load_to_fall(monkeypatch):
    from bench import machine_load

    cores = machine_load.os.cpu_count() or 1
    loads = iter([2.0, 1.5, 0.9, 0.3, 0.3])  # per core, as the previous row's load decays
    monkeypatch.setattr(machine_load.os, "getloadavg", lambda: (next(loads) * cores, 0, 0))
    slept = []
    assert machine_load.settle(sleep=slept.append) == 0.3 and len(slept) == 3
    # A machine that stays busy: it gives up after max_wait_s and says the load it measured at.
    monkeypatch.setattr(machine_load.os, "getloadavg", lambda: (2.0 * cores, 0, 0))
    slept.clear()
    assert (
        machine_load.settle(max_wait_s=20, poll_s=5, sleep=slept.append) == 2.0 and len(slept) == 4
    )


def test_the_bench_rows_come_from_the_table():
    from bench import spatial
    from common import benchmarks

    rows = spatial.plan(None, [1, 2], [True, False])
    configs = [
        c
        for name in benchmarks.names_with("spatial_bench")
        for c in benchmarks.get(name).spatial_bench
    ]
    assert [r["config"] for r in rows] == [
        c for c in configs for _ in range(3)
    ]  # K=1, K=2 on and off
    assert [(r["spatial_ranks"], r["halo_overlap"]) for r in rows[:3]] == [
        (1, None),
        (2, True),
        (2, False),
    ]
    with pytest.raises(SystemExit, match="not a spatial_bench config"):
        spatial.plan(["deepcam/configs/deepcam_synthetic_cpu.yaml"], [2], [True])


def test_the_slab_control_is_the_unsplit_model_on_a_slab_each():
    """--slab-control: per K > 1 one more row, K ranks unsplit, the sample cut to 1/K along the
    benchmark's split axis; its ratios are against the one-rank row, never taken for it."""
    from bench import spatial
    from common import benchmarks

    rows = spatial.plan(None, [1, 2], [True], slab_control=True)
    configs = [
        c
        for name in benchmarks.names_with("spatial_bench")
        for c in benchmarks.get(name).spatial_bench
    ]
    controls = [r for r in rows if r.get("slab_control")]
    assert [r["config"] for r in controls] == configs
    assert all((r["spatial_ranks"], r["ranks"], r["slab_control"]) == (1, 2, 2) for r in controls)
    assert not [
        r for r in spatial.plan(None, [1, 2], [True]) if r.get("slab_control")
    ]  # the negative control

    def extent(row):  # the sample's extent along its benchmark's split axis
        data = spatial.row_config(row, []).data
        return (
            data.sample_shape[0]
            if benchmarks.get(row["benchmark"]).spatial_split == "depth"
            else data.height
        )

    whole = {r["config"]: extent(r) for r in rows if r["ranks"] == 1}
    assert {r["config"]: extent(r) for r in controls} == {c: e // 2 for c, e in whole.items()}
    assert all(spatial.row_config(r, []).parallel.spatial_ranks == 1 for r in controls)
    # Ratios: against the one-rank row of the same config and sample, the control included.
    measured = [
        {
            "config": "c",
            "sample_name": "8^3",
            "spatial_ranks": 1,
            "ranks": 1,
            "samples_per_s": 2.0,
            "peak_rss_above_import_gib": 4.0,
        },
        {
            "config": "c",
            "sample_name": "8^3",
            "spatial_ranks": 1,
            "ranks": 2,
            "slab_control": 2,
            "samples_per_s": 1.5,
            "peak_rss_above_import_gib": 1.0,
        },
    ]
    ratios = [
        (r["speed_vs_unsplit"], r["above_import_vs_unsplit"])
        for r in spatial.with_unsplit_ratios(measured)
    ]
    assert ratios == [(1.0, 1.0), (0.75, 0.25)]


def test_shard_optimizer_shards_the_split_rows_only():
    """--shard-optimizer: the K > 1 split rows run parallel.shard_optimizer (the trainer's ShardedUpdate,
    common.run.trainer.optimizer_shard), and say so; K = 1 and the slab control, which have no group to
    shard over, do not (the config refuses it at K = 1)."""
    from bench import spatial

    rows = spatial.plan(None, [1, 2], [True, False], slab_control=True, shard_optimizer=True)
    sharded = [r for r in rows if spatial.row_config(r, []).parallel.shard_optimizer]
    assert sharded and sharded == [r for r in rows if r["spatial_ranks"] > 1]
    assert not [
        r
        for r in spatial.plan(None, [1, 2], [True, False], slab_control=True)
        if spatial.row_config(r, []).parallel.shard_optimizer
    ]  # the negative control
    assert spatial.halo_label(sharded[0], overlapping_layers=3) == "overlapped; optimizer sharded"
    assert (
        spatial.halo_label(sharded[0] | {"halo_overlap": False}, 0)
        == "exchanged first; optimizer sharded"
    )
    unsharded = {k: v for k, v in sharded[0].items() if k != "shard_optimizer"}
    assert (
        spatial.halo_label(unsharded, overlapping_layers=0) == "exchanged first (nothing overlaps)"
    )


def test_the_table_says_horovod_s_fusion_buffer():
    """Its size moves a split rank's peak RSS on the CPU (docs/figures.md)."""
    from bench import spatial

    assert spatial.fusion_buffer({}) == "128 MiB (Horovod's default)"
    assert (
        spatial.fusion_buffer({"HOROVOD_FUSION_THRESHOLD": "8388608"})
        == "HOROVOD_FUSION_THRESHOLD=8388608 B"
    )


def test_the_halo_share_is_the_union_of_the_alltoalls_in_flight(tmp_path):
    from bench import spatial

    events = [
        {"name": "process_name", "ph": "M", "pid": p, "args": {"name": n}}
        for p, n in ((1, "conv1/conv1.halo"), (2, "conv2/conv2.halo"), (3, "gradient_0"))
    ]
    for pid, (submitted, begin, end) in {
        1: (0, 100, 300),
        2: (200, 400, 500),
        3: (0, 10, 900),
    }.items():
        kind = "ALLREDUCE" if pid == 3 else "ALLTOALL"  # an allreduce is no halo
        events += [
            {"ph": "B", "name": f"NEGOTIATE_{kind}", "ts": submitted, "pid": pid},
            {"ph": "E", "ts": begin, "pid": pid},
            {"ph": "B", "name": kind, "ts": begin, "pid": pid},
            {"ph": "E", "ts": end, "pid": pid},
        ]
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(events)[:-1] + ",")  # as a stopped timeline leaves it: no "]"
    shares = spatial.halo_shares(path, step_seconds=1e-3)  # 1000 us
    # In flight: [0, 300] and [200, 500] overlap: 500 us; transferring: [100, 300] and [400, 500]: 300 us.
    assert shares == {"alltoalls": 2, "halo_in_flight_share": 0.5, "halo_transfer_share": 0.3}
