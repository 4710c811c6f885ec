"""bench/sweep.py on the CPU at the smallest sizes: its records have the
schema of bench.py's, each printed ratio is torch's record over ours of the
same shape and pass, a rerun replaces the records of the same key and keeps
the others, and the order covers every (cell, dtype) before refining."""
import json
import re
import sys

import pytest
import torch

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import sweep  # noqa: E402

SCHEMA = {"impl", "cell", "dtype", "batch", "hidden", "input", "steps", "layers", "pass", "us_per_step",
          "device", "torch", "cuda", "date"}


@pytest.fixture
def one_thread():
    """One CPU thread: a thread pool on a busy machine stalls calls for milliseconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def rec(impl, batch, pass_name, us, **extra):
    return {"impl": impl, "cell": "lstm", "dtype": "float32", "batch": batch, "hidden": 8, "input": 8, "steps": 4,
            "layers": 1, "pass": pass_name, "us_per_step": us, "device": "cpu", **extra}


def test_ratio_pairs_the_same_shape_and_pass():
    records = [rec("prnn", 1, "fwd", 2.0), rec("torch", 2, "fwd", 30.0), rec("prnn", 2, "fwd", 5.0),
               rec("torch", 1, "fwdbwd", 70.0), rec("torch", 1, "fwd", 3.0), rec("prnn", 1, "fwdbwd", 7.0),
               rec("prnn", 1, "fwd", 1.0, packed=True)]  # no torch record of its key: no ratio
    got = {(ours["batch"], ours["pass"]): (theirs["us_per_step"], ratio)
           for ours, theirs, ratio in sweep.ratios(records)}
    assert got == {(1, "fwd"): (3.0, 1.5), (2, "fwd"): (30.0, 6.0), (1, "fwdbwd"): (70.0, 10.0)}


def test_sweep_records_and_printed_ratios(tmp_path, capsys, one_thread):
    out = tmp_path / "sweep.json"
    stale = rec("prnn", 1, "fwd", 1e9) | {"cell": "rnn_tanh", "hidden": 16, "input": 16}
    other = rec("prnn", 64, "fwd", 5.0)
    out.write_text(json.dumps([stale, other]))
    sweep.main(["--device", "cpu", "--cells", "rnn", "lstm", "--batches", "1", "2", "--hiddens", "16",
                "--steps", "4", "--out", str(out)])
    printed = capsys.readouterr().out
    records = json.loads(out.read_text())
    assert other in records and stale not in records  # replaced by this run's record of its key
    new = [r for r in records if r != other]
    assert len(new) == 2 * 2 * 2 * 2  # cells x batches x passes x impls
    for r in new:
        extra = {"tier", "backward_tier"} if r["pass"] == "fwdbwd" else {"tier"}
        assert set(r) == SCHEMA | (extra if r["impl"] == "prnn" else set()), r
        assert r["impl"] in ("prnn", "torch") and r["device"] == "cpu" and r["us_per_step"] > 0
        assert (r["input"], r["steps"], r["layers"], r["dtype"]) == (16, 4, 1, "float32")
    by_key = {(r["impl"], r["cell"], r["batch"], r["pass"]): r["us_per_step"] for r in new}
    lines = re.findall(r"^(rnn|lstm) +float32 +B= *(\d+) .* (fwd|fwdbwd) +prnn +([\d.]+) torch +([\d.]+) us/step"
                       r" +ratio +([\d.]+)", printed, re.M)
    assert len(lines) == 8, printed
    for cell, batch, pass_name, ours, theirs, ratio in lines:
        cell = sweep.CELLS[cell][3]
        ours_us = by_key[("prnn", cell, int(batch), pass_name)]
        torch_us = by_key[("torch", cell, int(batch), pass_name)]
        assert (float(ours), float(theirs)) == (round(ours_us, 2), round(torch_us, 2))
        assert float(ratio) == pytest.approx(torch_us / ours_us, abs=0.006)
    assert "worst ratio" in printed


def test_fixed_cost_and_packed_records(tmp_path, one_thread):
    out = tmp_path / "modes.json"
    small = ["--device", "cpu", "--cells", "gru", "--batches", "2", "--hiddens", "8", "--out", str(out)]
    sweep.main(small + ["--fixed-cost", "--steps", "1", "4", "16"])
    sweep.main(small + ["--packed", "--steps", "8", "--seed", "1"])
    records = json.loads(out.read_text())
    fixed = [r for r in records if "fixed_us_per_call" in r]
    assert {(r["impl"], r["pass"]) for r in fixed} == {(i, p) for i in ("prnn", "torch") for p in sweep.PASSES}
    assert all(r["fit_steps"] == [1, 4, 16] and "steps" not in r for r in fixed)
    packed = [r for r in records if "packed" in r]
    assert {(r["impl"], r["pass"], r["packed"]) for r in packed} == {
        (i, p, k) for i in ("prnn", "torch") for p in sweep.PASSES for k in (True, False)}
    assert all(SCHEMA <= set(r) and r["lengths_seed"] == 1 and 2 <= r["mean_length"] <= 8 for r in packed)


def test_fit_line_recovers_a_line():
    fixed, per_step = sweep.fit_line({t: 30.0 + 2.5 * t for t in (1, 2, 4, 8, 16)})
    assert fixed == pytest.approx(30.0) and per_step == pytest.approx(2.5)


def test_order_covers_every_group_first():
    assert sweep.spread([16, 1, 2, 4, 8]) == [1, 16, 4, 2, 8]
    order = sweep.sweep_order(["a", "b"], [1, 8, 64], [16], [4, 512])
    assert sorted(order) == sorted((g, b, 16, t) for g in "ab" for b in (1, 8, 64) for t in (4, 512))
    # The smallest shape, then the corners cheapest first, each for both groups; the middle batch last.
    assert order == [(g, b, 16, t) for b, t in ((1, 4), (64, 4), (1, 512), (64, 512), (8, 4), (8, 512)) for g in "ab"]
