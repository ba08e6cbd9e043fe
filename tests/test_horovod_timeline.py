"""Horovod's timeline as Distribution.timeline records it and bench/horovod_timeline.py reads it,
on 2 real Gloo ranks: a tensor another rank submitted before rank 0 started the timeline.

CI once failed bench/spatial.py's K=2 row this way: rank 1 was ahead, its first collective of the
timed block began negotiating unrecorded, the file held that negotiation's end alone, and the reader
raised on an end without a begin."""

import json

import pytest

from bench.horovod_timeline import activities


@pytest.fixture(scope="module")
def probe(two_rank_probe):
    return two_rank_probe("timeline")


def test_a_collective_another_rank_submitted_first_is_recorded_whole(probe):
    recorded = json.loads((probe / "distribution.json").read_text())["late_distribution"]
    assert (
        recorded["NEGOTIATE_ALLREDUCE_begin"]
        < recorded["NEGOTIATE_ALLREDUCE_end"]
        <= recorded["ALLREDUCE_begin"]
        < recorded["ALLREDUCE_end"]
    ), recorded


def test_the_control_without_the_barrier_records_the_end_alone_and_the_reader_takes_it(probe):
    # Horovod's start alone: the negotiation began before the file was open. The reader keeps what
    # it can pair (the allreduce itself) and leaves the lone end out instead of raising.
    recorded = json.loads((probe / "bare.json").read_text())["late_bare"]
    assert (
        "NEGOTIATE_ALLREDUCE_begin" not in recorded and "NEGOTIATE_ALLREDUCE_end" not in recorded
    ), recorded
    assert recorded["ALLREDUCE_begin"] < recorded["ALLREDUCE_end"], recorded


def test_the_reader_pairs_begins_and_ends_per_tensor_and_leaves_lone_ones(tmp_path):
    # A file as Horovod leaves it when stopped: a lone end first (tensor a), a begin never ended
    # (tensor b), the last ",\n" and no closing "]".
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "a"}},
        {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "b"}},
        {"ph": "E", "pid": 1, "ts": 5},
        {"ph": "X", "name": "0", "pid": 1, "ts": 6},
        {"ph": "B", "name": "ALLREDUCE", "pid": 1, "ts": 7},
        {"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "pid": 1, "ts": 8},
        {"ph": "E", "pid": 1, "ts": 9},
        {"ph": "E", "pid": 1, "ts": 12},
        {"ph": "B", "name": "NEGOTIATE_ALLTOALL", "pid": 2, "ts": 13},
    ]
    path = tmp_path / "timeline.json"
    path.write_text("[\n" + "".join(json.dumps(e) + ",\n" for e in events))
    assert activities(path) == {
        "a": {
            "ALLREDUCE_begin": 7,
            "MEMCPY_IN_FUSION_BUFFER_begin": 8,
            "MEMCPY_IN_FUSION_BUFFER_end": 9,
            "ALLREDUCE_end": 12,
        },
        "b": {"NEGOTIATE_ALLTOALL_begin": 13},
    }
