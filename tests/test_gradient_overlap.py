"""Gradients averaged as backward produces them (runtime.gradient_allreduce=overlap, the default):
the order, from a Horovod timeline and TensorFlow's trace of one step on 2 ranks, and the result, equal
bit for bit to the grouped allreduce after backward (tests/overlap_probe.py runs the three variants,
in the launch of tests/two_rank_probes.py).

Gloo over loopback shares these 2 cores with the backward pass, so what overlap buys in time is
not judged here (docs/figures.md gives the figure of one CPU)."""

import json

import numpy as np
import pytest

from bench.horovod_timeline import activities


@pytest.fixture(scope="module")
def probe(two_rank_probe):
    return two_rank_probe("overlap")


def test_allreduces_start_while_backward_still_produces_gradients(probe):
    # The gradients' collectives only: the other rank's barrier after a variant may reach rank 0's
    # timeline before rank 0 stops it (seen once in a CI rehearsal).
    overlap, grouped = (
        {
            name: t
            for name, t in activities(probe / variant / "timeline.json").items()
            if "gradient" in name
        }
        for variant in ("overlap", "grouped")
    )
    # Overlap: a tensor each, handed to Horovod as backward produces it: the head's gradient first,
    # the first layer's last. Horovod's timeline says so by when its background thread took each
    # request (its negotiation's begin), which a loaded CPU delays and batches into few cycles.
    assert sorted(overlap) == sorted(f"gradient_{i}" for i in range(14))
    submitted = {name: t["NEGOTIATE_ALLREDUCE_begin"] for name, t in overlap.items()}
    assert submitted["gradient_13"] < submitted["gradient_0"], submitted
    assert len(grouped) == 14
    # When: TensorFlow's own trace of the step. The executor launched the first allreduce while
    # backward's ops still had a quarter of their time to run (the step's order, whatever the load).
    profile = json.loads((probe / "overlap" / "profile.json").read_text())
    begin, end = profile["backward"]
    first = min(profile["launches"].values())
    assert begin < first < end - 0.25 * (end - begin), profile
    # The control: the grouped allreduce, launched once backward's last op is done.
    control = json.loads((probe / "grouped" / "profile.json").read_text())
    assert min(control["launches"].values()) >= control["backward"][1], control


def test_overlapped_and_grouped_allreduces_give_the_same_weights_bit_for_bit(probe):
    weights = {
        v: [np.load(probe / v / f"rank-{r:05d}.npz") for r in (0, 1)]
        for v in ("overlap", "grouped", "overlap-fp16")
    }
    names = weights["overlap"][0].files
    assert len(names) == 14
    for rank in (0, 1):
        assert all(
            np.array_equal(weights["overlap"][rank][n], weights["grouped"][rank][n]) for n in names
        )
        assert all(
            np.array_equal(weights["overlap"][rank][n], weights["overlap"][0][n]) for n in names
        )
    # The negative control: fp16 on the wire rounds the averages, and the comparison sees it.
    assert not any(
        np.array_equal(weights["overlap"][0][n], weights["overlap-fp16"][0][n]) for n in names
    )
