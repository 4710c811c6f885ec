"""The CPU ops' ATen recurrences against the C reference of the C API, which
PRNN_CPU_REFERENCE=1 makes them call: the same outputs and gradients within
float32 rounding, with and without lengths (state frozen past a length,
zeros there; lengths that never increase, a PackedSequence's, run on the live
rows alone), relu at NaN, LSTM's projection and the gated ops' saved tensors."""
import pytest
import torch

import torch_prnn  # noqa: F401  (registers the ops)

ops = torch.ops.prnn
TOL = {torch.float32: 2e-5, torch.float64: 1e-12}


def both_paths(monkeypatch, fn):
    """fn() on the ATen path, then on the C reference."""
    ours = fn()
    monkeypatch.setenv("PRNN_CPU_REFERENCE", "1")
    ref = fn()
    monkeypatch.delenv("PRNN_CPU_REFERENCE")
    return ours, ref


def assert_close(ours, ref, dtype):
    assert len(ours) == len(ref)
    for k, (a, b) in enumerate(zip(ours, ref)):
        assert a.shape == b.shape and a.dtype == b.dtype, k
        assert torch.equal(torch.isnan(a), torch.isnan(b)), k
        a, b = a.nan_to_num().double(), b.nan_to_num().double()
        scale = b.norm().clamp_min(1.0)
        assert (a - b).norm() / scale < TOL[dtype], (k, ((a - b).norm() / scale).item())


LENGTHS = ["none", "unsorted", "non-increasing"]


def lengths_for(batch, steps, order):
    """Lengths with a zero and a full one: None, unsorted, or never increasing
    along the batch with a tie (the live sequences of a step are leading rows)."""
    if order == "none":
        return None
    lengths = torch.randint(0, steps + 1, (batch,))
    lengths[0], lengths[-1] = 0, steps  # unsorted whatever the draw
    if order == "non-increasing":
        lengths = lengths.sort(descending=True).values
        lengths[1] = steps
    return lengths


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
@pytest.mark.parametrize("order", LENGTHS)
def test_elman(monkeypatch, dtype, nonlinearity, order):
    torch.manual_seed(0)
    T, B, H = 7, 5, 33
    xp = torch.randn(T, B, H, dtype=dtype)
    h0 = torch.randn(B, H, dtype=dtype)
    w_hh = torch.randn(H, H, dtype=dtype) / H**0.5
    if nonlinearity == "relu":
        xp[2, 1, 3] = float("nan")  # relu keeps NaN; its gradient passes there
    lengths = lengths_for(B, T, order)
    grad_y = torch.randn(T, B, H, dtype=dtype)
    ours, ref = both_paths(monkeypatch, lambda: ops.forward(xp, h0, w_hh, lengths, nonlinearity))
    assert_close(ours, ref, dtype)
    y = ref[0]
    ours, ref = both_paths(monkeypatch, lambda: ops.backward(grad_y, y, h0, w_hh, lengths, nonlinearity))
    assert_close(ours, ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cell", ["lstm", "lstm_proj", "gru"])
@pytest.mark.parametrize("order", LENGTHS)
@pytest.mark.parametrize("save", [False, True])
def test_gated(monkeypatch, dtype, cell, order, save):
    torch.manual_seed(1)
    T, B, H = 6, 4, 17
    lstm = cell != "gru"
    G = 4 if lstm else 3
    S = 7 if cell == "lstm_proj" else H
    xp = torch.randn(T, B, G * H, dtype=dtype)
    b_hh = torch.randn(G * H, dtype=dtype)
    h0 = torch.randn(B, S, dtype=dtype)
    c0 = torch.randn(B, H, dtype=dtype)
    w_hh = torch.randn(G * H, S, dtype=dtype) / S**0.5
    w_hr = torch.randn(S, H, dtype=dtype) / H**0.5 if cell == "lstm_proj" else None
    lengths = lengths_for(B, T, order)
    if lstm:
        forward = lambda: ops.lstm(xp, b_hh, h0, c0, w_hh, w_hr, lengths, save)  # noqa: E731
    else:
        forward = lambda: ops.gru(xp, b_hh, h0, w_hh, lengths, save)  # noqa: E731
    ours, ref = both_paths(monkeypatch, forward)
    assert_close(ours, ref, dtype)
    if not save:
        return
    y, saved = ref[0], ref[-1]
    grad_y = torch.randn_like(y)
    grad_h_n = torch.randn(B, S, dtype=dtype)
    grad_c_n = torch.randn(B, H, dtype=dtype)
    if lstm:
        backward = lambda: ops.lstm_backward(  # noqa: E731
            grad_y, grad_h_n, grad_c_n, h0, c0, y, saved, w_hh, w_hr, lengths)
    else:
        backward = lambda: ops.gru_backward(grad_y, grad_h_n, h0, y, saved, w_hh, lengths)  # noqa: E731
    ours, ref = both_paths(monkeypatch, backward)
    assert_close(ours, ref, dtype)
