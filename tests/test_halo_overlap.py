"""The halo exchange overlapped with the interior of a split convolution (parallel.halo_overlap):
a TensorFlow trace of one SpatialConv3D on 2 ranks (tests/halo_overlap_probe.py, one launch),
its exchange-first path as the control. That both paths compute the unsplit function is
tests/test_spatial.py's (the layer exactly, the model's step within 1e-5, each with the halo
switched off as the negative control).

Gloo over loopback shares these 2 cores with the convolution, so what the overlap buys in time
is not judged here (bench/spatial.py measures it)."""

import json

import pytest

from tests import helpers


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = tmp_path_factory.mktemp("halo_overlap")
    proc = helpers.horovodrun(2, [helpers.PYTHON, helpers.REPO / "tests" / "halo_overlap_probe.py", "--out", out])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {v: json.loads((out / f"{v}.json").read_text()) for v in ("overlap", "exchange-first")}


def test_the_interior_convolution_runs_while_the_alltoall_is_in_flight(traces):
    t = traces["overlap"]
    (sent, arrived), convolutions = t["alltoall"], t["convolutions"]
    assert arrived - sent > 0.5e6, t   # rank 1 came 1 s late: the exchange was in flight that long
    assert sorted(convolutions) == ["boundary_above", "boundary_below", "interior"], t
    # The interior was computed inside that window (it may begin a few us before the asynchronous
    # kernel's start event, right after the tensor handed to it), and done before the halo came;
    # only the planes next to each neighbour waited for it.
    begin, end = convolutions["interior"]
    assert begin < arrived and sent < end < arrived, t
    assert convolutions["boundary_below"][0] > arrived and convolutions["boundary_above"][0] > arrived, t


def test_exchange_first_convolves_the_slab_after_the_halo_came(traces):
    # The control: the same trace and reading, with the halo exchanged before one convolution.
    t = traces["exchange-first"]
    (sent, arrived), convolutions = t["alltoall"], t["convolutions"]
    assert arrived - sent > 0.5e6, t
    assert len(convolutions) == 1 and all(begin > arrived for begin, _ in convolutions.values()), t

