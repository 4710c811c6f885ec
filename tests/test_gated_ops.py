"""prnn::lstm / prnn::gru and their backward ops: parity with torch's own
cells (nn.LSTM / nn.GRU with the same weights, xp = x W_ih^T + b_ih computed
here), lengths against PackedSequence, layouts, registrations (gradcheck,
opcheck, autograd, autocast, torch.compile), errors, empty sizes, plans."""

import copy
import random

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import torch_prnn
from conftest import TOL, cluster_tier_available, needs_cuda, rel_err

lstm, lstm_backward = torch.ops.prnn.lstm, torch.ops.prnn.lstm_backward
gru, gru_backward = torch.ops.prnn.gru, torch.ops.prnn.gru_backward

# CUDA variants are listed (and skipped) on machines without a GPU.
devices = ["cpu", pytest.param("cuda", marks=needs_cuda)]

# (cell, with a projection): the three cells the ops run.
CELLS = [("lstm", False), ("lstm", True), ("gru", False)]
CELL_IDS = ["lstm", "lstm-proj", "gru"]


def proj_size_for(H, proj):
    """A projection narrower than H (nn.LSTM requires proj_size < hidden_size)."""
    return max(1, H // 2) if proj else 0


def twin(cell, I, H, P=0, bias=True, device="cpu", dtype=torch.float64, seed=0):
    """torch's own layer with random weights: nn.LSTM (proj_size P) or nn.GRU."""
    torch.manual_seed(seed)
    if cell == "lstm":
        return nn.LSTM(I, H, bias=bias, proj_size=P, device=device, dtype=dtype)
    return nn.GRU(I, H, bias=bias, device=device, dtype=dtype)


def ours(m, x, h0, c0, lengths=None):
    """The op on the layer `m`'s weights: (y, h_n[, c_n])."""
    xp = x @ m.weight_ih_l0.t()
    if m.bias:
        xp = xp + m.bias_ih_l0
    b_hh = m.bias_hh_l0 if m.bias else None
    if isinstance(m, nn.LSTM):
        w_hr = m.weight_hr_l0 if m.proj_size > 0 else None
        y, h_n, c_n, saved = lstm(xp, b_hh, h0, c0, m.weight_hh_l0, w_hr, lengths)
        assert saved.shape == (0,) and not saved.requires_grad
        return y, h_n, c_n
    y, h_n, saved = gru(xp, b_hh, h0, m.weight_hh_l0, lengths)
    assert saved.shape == (0,)
    return y, h_n


def theirs(m, x, h0, c0, lengths=None):
    """torch's layer on the same inputs: (y, h_n[, c_n]); with lengths through
    a PackedSequence, y padded with zeros."""
    state = (h0[None], c0[None]) if isinstance(m, nn.LSTM) else h0[None]
    if lengths is None:
        y, hc = m(x, state)
    else:
        packed, hc = m(pack_padded_sequence(x, lengths, enforce_sorted=False), state)
        y = pad_packed_sequence(packed, total_length=x.shape[0])[0]
    if isinstance(m, nn.LSTM):
        return y, hc[0][0], hc[1][0]
    return y, hc[0]


def leaves_of(m, x, h0, c0):
    """Every input the outputs depend on: x, h0, (c0,) and the weights."""
    return [x, h0] + ([c0] if isinstance(m, nn.LSTM) else []) + list(m.parameters())


def names_of(m):
    return ["x", "h0"] + (["c0"] if isinstance(m, nn.LSTM) else []) + [n for n, _ in m.named_parameters()]


def outputs_and_grads(fn, m, x, h0, c0, lengths, weights):
    """fn's outputs and the gradients of a random-weighted loss of all of them
    (so that y, h_n and c_n each send a gradient) with respect to every input."""
    outs = fn(m, x, h0, c0, lengths)
    loss = sum((o * w.to(o.dtype)).sum() for o, w in zip(outs, weights))
    return list(outs) + list(torch.autograd.grad(loss, leaves_of(m, x, h0, c0)))


def make_state(m, B, device, dtype, seed=1):
    """x is drawn by the caller; h0 [B, S] and c0 [B, H] here."""
    gen = torch.Generator().manual_seed(seed)
    S = m.proj_size if isinstance(m, nn.LSTM) and m.proj_size > 0 else m.hidden_size
    h0 = torch.randn(B, S, generator=gen, dtype=torch.float64).to(device, dtype)
    c0 = torch.randn(B, m.hidden_size, generator=gen, dtype=torch.float64).to(device, dtype)
    return h0, c0


def check_against_torch(cell, proj, device, dtype, T, B, I, H, bias=True, lengths=None, seed=0, what=""):
    """Outputs and every gradient of the op on the weights of torch's layer
    against that layer: in float64 within TOL; in float32 against the layer in
    float64, within 10x torch's own float32 error there (and 1e-6)."""
    m64 = twin(cell, I, H, proj_size_for(H, proj), bias, device, torch.float64, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    x64 = torch.randn(T, B, I, generator=gen, dtype=torch.float64).to(device)
    h064, c064 = make_state(m64, B, device, torch.float64, seed + 2)
    inputs64 = [t.requires_grad_() for t in (x64, h064, c064)]
    weights = [torch.randn_like(o) for o in theirs(m64, *inputs64, lengths)]
    reference = outputs_and_grads(theirs, m64, *inputs64, lengths, weights)
    names = ["y", "h_n"] + (["c_n"] if cell == "lstm" else []) + [f"grad {n}" for n in names_of(m64)]
    if dtype == torch.float64:
        got = outputs_and_grads(ours, m64, *inputs64, lengths, weights)
        for name, g, r in zip(names, got, reference, strict=True):
            err = rel_err(g, r)
            assert err < TOL[dtype], f"{what}{name}: relative error {err:.3g} >= {TOL[dtype]:g}"
        return
    m32 = copy.deepcopy(m64).to(dtype)
    inputs32 = [t.detach().to(dtype).requires_grad_() for t in inputs64]
    got = outputs_and_grads(ours, m32, *inputs32, lengths, weights)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # cuDNN's float32 without TF32
        torch32 = outputs_and_grads(theirs, m32, *inputs32, lengths, weights)
    for name, g, t, r in zip(names, got, torch32, reference, strict=True):
        assert g.dtype == dtype and g.shape == r.shape
        err, torch_err = rel_err(g, r), rel_err(t, r)
        bound = max(10 * torch_err, 1e-6)
        assert err < bound, f"{what}{name}: relative error {err:.3g} >= {bound:.3g} (torch float32's {torch_err:.3g})"


SIZES = [(1, 1, 1, 1), (5, 3, 4, 7), (4, 2, 3, 33), (1, 5, 2, 7), (6, 1, 3, 33)]


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("cell,proj", CELLS, ids=CELL_IDS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("T,B,I,H", SIZES)
def test_matches_torch(device, dtype, cell, proj, bias, T, B, I, H):
    if proj and H == 1:
        pytest.skip("nn.LSTM needs proj_size < hidden_size")
    check_against_torch(cell, proj, device, dtype, T, B, I, H, bias)


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("cell,proj", CELLS, ids=CELL_IDS)
@pytest.mark.parametrize("T,B", [(1, 4), (6, 5), (9, 1)])
def test_lengths_match_packed_sequence(device, dtype, cell, proj, T, B):
    """Per-sequence lengths (T among them) against torch's layer on a
    PackedSequence: y zero past a length, h_n and c_n at the last valid step,
    and every gradient."""
    gen = torch.Generator().manual_seed(T * 10 + B)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    lengths[(T + B) % B] = T
    check_against_torch(cell, proj, device, dtype, T, B, 3, 7, lengths=lengths, what=f"lengths {lengths.tolist()}: ")


def reference(cell, xp, b_hh, h0, c0, w_hh, w_hr=None, lengths=None):
    """The ops' definition (prnn.h, "Gated cells") as a float64 loop:
    (y, h_n, c_n); past a sequence's length its state is frozen and y zero."""
    xp, h, w = xp.double(), h0.double(), w_hh.double()
    c = c0.double() if c0 is not None else None
    b = b_hh.double() if b_hh is not None else 0
    ys = []
    for t in range(xp.shape[0]):
        hh = h @ w.t() + b
        if cell == "lstm":
            i, f, g, o = (xp[t] + hh).chunk(4, 1)
            c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h_new = torch.sigmoid(o) * torch.tanh(c_new)
            if w_hr is not None:
                h_new = h_new @ w_hr.double().t()
        else:
            (xr, xz, xn), (hr, hz, hn) = xp[t].chunk(3, 1), hh.chunk(3, 1)
            r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
            h_new = (1 - z) * torch.tanh(xn + r * hn) + z * h
            c_new = None
        if lengths is not None:
            alive = (t < lengths).to(xp.device).unsqueeze(1)
            h_new = torch.where(alive, h_new, h)
            c_new = torch.where(alive, c_new, c) if c is not None else None
            ys.append(torch.where(alive, h_new, torch.zeros_like(h_new)))
        else:
            ys.append(h_new)
        h, c = h_new, c_new
    return torch.stack(ys) if ys else xp.new_zeros(0, *h.shape), h, c


def make_inputs(cell, T, B, H, P=0, dtype=torch.float64, device="cpu", bias=True, seed=0):
    """The op's own inputs, in nn.LSTM's ranges: xp, b_hh, h0, c0, w_hh, w_hr
    (b_hh None without bias; c0 None for a GRU, w_hr None without P)."""
    gen = torch.Generator().manual_seed(seed)
    G, S = (4 if cell == "lstm" else 3), P or H

    def uniform(*shape, scale=1.0):
        return ((torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1) * scale).to(device, dtype)

    return dict(
        xp=uniform(T, B, G * H, scale=2.0),
        b_hh=uniform(G * H, scale=max(H, 1) ** -0.5) if bias else None,
        h0=uniform(B, S),
        c0=uniform(B, H) if cell == "lstm" else None,
        w_hh=uniform(G * H, S, scale=max(H, 1) ** -0.5),
        w_hr=uniform(P, H, scale=max(H, 1) ** -0.5) if P else None,
    )


def run(cell, inputs, lengths=None, save=False):
    """The forward op on make_inputs' dict: (y, h_n, c_n or None, saved)."""
    a = inputs
    if cell == "lstm":
        return lstm(a["xp"], a["b_hh"], a["h0"], a["c0"], a["w_hh"], a["w_hr"], lengths, save)
    y, h_n, saved = gru(a["xp"], a["b_hh"], a["h0"], a["w_hh"], lengths, save)
    return y, h_n, None, saved


def present(inputs):
    return {k: v for k, v in inputs.items() if v is not None}


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("cell,proj", CELLS, ids=CELL_IDS)
def test_lengths_semantics(device, cell, proj):
    """Lengths 0 and T and between, against the loop: y exactly zero past a
    length, h_n / c_n the state after the last valid step (h0 / c0 at length
    0), and grad_h_n / grad_c_n reach h0 / c0 unchanged at length 0."""
    T, B, H = 5, 4, 6
    inputs = {k: v.requires_grad_() for k, v in present(make_inputs(cell, T, B, H, proj_size_for(H, proj), device=device)).items()}
    full = {**dict.fromkeys(("b_hh", "c0", "w_hr")), **inputs}
    lengths = torch.tensor([T, 0, 2, 1])
    y, h_n, c_n, _ = run(cell, full, lengths)
    ref = reference(cell, **full, lengths=lengths)
    outs = [o for o in (y, h_n, c_n) if o is not None]
    refs = [r for r in ref if r is not None]
    for o, r in zip(outs, refs, strict=True):
        assert rel_err(o, r) < TOL[torch.float64]
    assert (y[:, 1] == 0).all() and (y[2:, 2] == 0).all() and (y[1:, 3] == 0).all()
    assert torch.equal(h_n[1], full["h0"][1])
    weights = [torch.randn_like(o) for o in outs]
    grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs, weights)), list(inputs.values()))
    grads_ref = torch.autograd.grad(sum((r * w).sum() for r, w in zip(refs, weights)), list(inputs.values()))
    for name, g, r in zip(inputs, grads, grads_ref):
        assert rel_err(g, r) < TOL[torch.float64], f"grad {name}"
    g = dict(zip(inputs, grads))
    assert (g["xp"][:, 1] == 0).all() and (g["xp"][2:, 2] == 0).all()
    assert torch.equal(g["h0"][1], weights[1][1])  # length 0: grad_h0 is grad_h_n
    if cell == "lstm":
        assert torch.equal(g["c0"][1], weights[2][1])


def strided_copy(t, pad):
    """t as a non-contiguous view into a larger buffer (a slice every `pad`
    elements of each row, rows apart), same values."""
    buf = torch.zeros(*t.shape[:-1], t.shape[-1] * pad + 1, dtype=t.dtype, device=t.device)
    view = buf[..., 1::pad]
    view.copy_(t)
    assert not view.is_contiguous()
    return view


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("cell,proj", CELLS, ids=CELL_IDS)
def test_non_contiguous_inputs(device, cell, proj):
    """Slices of larger buffers (non-unit last strides, copied by the shim),
    xp as a transposed batch-major tensor (unit last stride, passed as is),
    and an expanded grad_y: the results of the contiguous inputs."""
    T, B, H = 4, 3, 7
    dense = present(make_inputs(cell, T, B, H, proj_size_for(H, proj), device=device))
    strided = {k: strided_copy(v, 2) for k, v in dense.items()}
    strided["xp"] = dense["xp"].transpose(0, 1).contiguous().transpose(0, 1)  # strides (G*H, T*G*H, 1)
    strided["h0"] = dense["h0"].t().contiguous().t()  # last stride B
    results = []
    for inputs in (dense, strided):
        leaves = {k: v.detach().clone(memory_format=torch.preserve_format).requires_grad_() for k, v in inputs.items()}
        full = {**dict.fromkeys(("b_hh", "c0", "w_hr")), **leaves}
        y, h_n, c_n, _ = run(cell, full)
        loss = y.sum() + h_n.square().sum() + (c_n.sin().sum() if c_n is not None else 0)  # y.sum(): stride-0 grad_y
        results.append([y, h_n] + list(torch.autograd.grad(loss, list(leaves.values()))))
    for name, a, b in zip(["y", "h_n", *dense], *results, strict=True):
        if device == "cpu":
            assert torch.equal(a, b), name  # the same arithmetic in the same order
        else:
            assert rel_err(a, b) < TOL[torch.float64], name


GRADCHECK_CASES = [("lstm", 0, None), ("lstm", 2, None), ("lstm", 2, [4, 1, 0]), ("lstm", 0, [2, 4, 3]),
                   ("gru", 0, None), ("gru", 0, [4, 0, 3])]


@pytest.mark.parametrize("cell,P,lengths", GRADCHECK_CASES, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_gradcheck(cell, P, lengths, bias):
    inputs = present(make_inputs(cell, 4, 3, 3, P, bias=bias))
    names = list(inputs)
    lengths = torch.tensor(lengths) if lengths is not None else None

    def f(*tensors):
        full = {**dict.fromkeys(("b_hh", "c0", "w_hr")), **dict(zip(names, tensors))}
        y, h_n, c_n, _ = run(cell, full, lengths)
        return (y, h_n) if c_n is None else (y, h_n, c_n)

    assert torch.autograd.gradcheck(f, [t.requires_grad_() for t in inputs.values()])


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("cell,proj", CELLS, ids=CELL_IDS)
@pytest.mark.parametrize("with_lengths", [False, True])
@pytest.mark.parametrize("save", [False, True])
def test_opcheck(device, cell, proj, with_lengths, save):
    inputs = make_inputs(cell, 4, 3, 5, proj_size_for(5, proj), torch.float32, device)
    lengths = torch.tensor([4, 0, 2]) if with_lengths else None
    for t in present(inputs).values():
        t.requires_grad_()
    a = inputs
    if cell == "lstm":
        torch.library.opcheck(lstm, (a["xp"], a["b_hh"], a["h0"], a["c0"], a["w_hh"], a["w_hr"], lengths, save))
    else:
        torch.library.opcheck(gru, (a["xp"], a["b_hh"], a["h0"], a["w_hh"], lengths, save))
    # The backward op on the forward's own y and saved.
    with torch.no_grad():
        y, h_n, c_n, saved = run(cell, inputs, lengths, save=True)
    grad_y, grad_h_n = torch.randn_like(y), torch.randn_like(h_n) if with_lengths else None
    d = {k: v.detach() if v is not None else None for k, v in inputs.items()}
    if cell == "lstm":
        grad_c_n = torch.randn_like(c_n) if save else None
        args = (grad_y, grad_h_n, grad_c_n, d["h0"], d["c0"], y, saved, d["w_hh"], d["w_hr"], lengths)
        torch.library.opcheck(lstm_backward, args)
    else:
        torch.library.opcheck(gru_backward, (grad_y, grad_h_n, d["h0"], y, saved, d["w_hh"], lengths))


@pytest.mark.parametrize("cell,proj", CELLS, ids=CELL_IDS)
def test_backward_op_matches_autograd(cell, proj):
    """The backward op called directly (grad_h_n / grad_c_n None: zero) gives
    autograd's gradients of the loop, grad_b_hh included without a b_hh."""
    inputs = make_inputs(cell, 5, 3, 4, proj_size_for(4, proj), bias=False)
    lengths = torch.tensor([5, 2, 0])
    y, h_n, c_n, saved = run(cell, inputs, lengths, save=True)
    grad_y = torch.randn_like(y)
    leaves = {k: v.clone().requires_grad_() for k, v in present(inputs).items()}
    leaves["b_hh"] = torch.zeros(inputs["w_hh"].shape[0], dtype=torch.float64, requires_grad=True)
    y_ref = reference(cell, **{**dict.fromkeys(("c0", "w_hr")), **leaves}, lengths=lengths)[0]
    expected = dict(zip(leaves, torch.autograd.grad(y_ref, list(leaves.values()), grad_y)))
    a = inputs
    if cell == "lstm":
        names = ["xp", "h0", "c0", "w_hh", "b_hh", "w_hr"]
        got = lstm_backward(grad_y, None, None, a["h0"], a["c0"], y, saved, a["w_hh"], a["w_hr"], lengths)
    else:
        names = ["xp", "h0", "w_hh", "b_hh"]
        got = gru_backward(grad_y, None, a["h0"], y, saved, a["w_hh"], lengths)
    assert len(set(g.data_ptr() for g in got if g.numel())) == sum(g.numel() > 0 for g in got)  # distinct tensors
    for name, g in zip(names, got, strict=True):
        if name == "w_hr" and not proj:
            assert g.shape == (0,)
            continue
        assert g.is_contiguous() and rel_err(g, expected[name]) < TOL[torch.float64], f"grad {name}"


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("cell,proj", CELLS, ids=CELL_IDS)
def test_grad_of_one_input(device, cell, proj):
    """Only one input requires grad: the output is recorded and that input's
    gradient is the one computed with every input requiring grad; the others
    get none."""
    inputs = present(make_inputs(cell, 4, 3, 5, proj_size_for(5, proj), device=device))
    lengths = torch.tensor([4, 1, 3])

    def loss(leaves):
        y, h_n, c_n, _ = run(cell, {**dict.fromkeys(("b_hh", "c0", "w_hr")), **leaves}, lengths)
        return (y * y.detach().cos()).sum() + h_n.sin().sum() + (c_n.square().sum() if c_n is not None else 0)

    everything = {k: v.clone().requires_grad_() for k, v in inputs.items()}
    expected = dict(zip(everything, torch.autograd.grad(loss(everything), list(everything.values()))))
    for name in inputs:
        one = {k: v.clone().requires_grad_(k == name) for k, v in inputs.items()}
        out = loss(one)
        assert out.requires_grad, f"only {name} requires grad, but the output was not recorded"
        (got,) = torch.autograd.grad(out, one[name])
        assert rel_err(got, expected[name]) < TOL[torch.float64], f"grad {name}"


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_saved_and_no_graph(cell):
    """With a graph: `saved` as the caller asked for it and not differentiable.
    Without one (no_grad, or no input requiring grad) the op runs as called,
    and save=True gives the saved values of the recorded call."""
    inputs = present(make_inputs(cell, 4, 2, 3))
    lengths = torch.tensor([4, 2])
    full = {**dict.fromkeys(("b_hh", "c0", "w_hr")), **{k: v.clone().requires_grad_() for k, v in inputs.items()}}
    saved_width = (5 if cell == "lstm" else 4) * 3
    _, _, _, saved = run(cell, full, lengths)
    assert saved.shape == (0,) and not saved.requires_grad
    y, _, _, saved = run(cell, full, lengths, save=True)
    assert saved.shape == (4, 2, saved_width) and not saved.requires_grad and y.requires_grad
    with torch.no_grad():
        y2, _, _, saved2 = run(cell, full, lengths, save=True)
        assert run(cell, full, lengths)[3].shape == (0,)
    assert not y2.requires_grad and torch.equal(y2, y) and torch.equal(saved2, saved)
    assert (saved[2:, 1] == 0).all()  # zero past a length


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("what", ["y", "w_hh", "lengths"])
def test_changed_before_backward_raises(cell, what):
    """What the backward reads is saved as autograd's saved tensors: changing
    one in place before backward is autograd's error, not a wrong gradient."""
    inputs = {k: v.requires_grad_() for k, v in present(make_inputs(cell, 4, 2, 3)).items()}
    lengths = torch.tensor([4, 2])
    y, h_n, _, _ = run(cell, {**dict.fromkeys(("b_hh", "c0", "w_hr")), **inputs}, lengths)
    loss = h_n.sum()
    with torch.no_grad():
        {"y": y, "w_hh": inputs["w_hh"], "lengths": lengths}[what].add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(loss, inputs["xp"])


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_double_backward_raises(cell):
    inputs = {k: v.requires_grad_() for k, v in present(make_inputs(cell, 3, 2, 4)).items()}
    y = run(cell, {**dict.fromkeys(("b_hh", "c0", "w_hr")), **inputs})[0]
    (grad_xp,) = torch.autograd.grad(y.sum(), inputs["xp"], create_graph=True)
    with pytest.raises(RuntimeError, match=f"prnn::{cell}_backward: double backward .* is not supported"):
        grad_xp.sum().backward()


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("which", ["xp", "h0", "w_hh"])
def test_forward_mode_ad_raises(device, cell, which):
    import torch.autograd.forward_ad as fwAD
    inputs = make_inputs(cell, 3, 2, 4, device=device)
    with fwAD.dual_level():
        inputs[which] = fwAD.make_dual(inputs[which], torch.randn_like(inputs[which]))
        with pytest.raises(RuntimeError, match=f"prnn::{cell}: forward-mode AD .* is not supported"):
            run(cell, inputs)


@pytest.mark.parametrize("cell,proj", CELLS, ids=CELL_IDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_reduced_precision_cpu_is_float32_rounded_once(cell, proj, dtype):
    """On the CPU, float16 and bfloat16 run the float32 loop on upcast
    inputs: bit for bit the float32 op's results cast down, forward and
    backward."""
    inputs = make_inputs(cell, 6, 3, 5, proj_size_for(5, proj), dtype)
    wide = {k: v.float() if v is not None else None for k, v in inputs.items()}
    lengths = torch.tensor([6, 0, 3])
    outs, outs_wide = run(cell, inputs, lengths, True), run(cell, wide, lengths, True)
    for o, w in zip(outs, outs_wide):
        assert o is None or (o.dtype == dtype and torch.equal(o, w.to(dtype)))
    y, h_n, c_n, saved = outs
    grad_y = torch.randn(y.shape).to(dtype)
    a, aw = inputs, wide
    if cell == "lstm":
        grads = lstm_backward(grad_y, h_n, c_n, a["h0"], a["c0"], y, saved, a["w_hh"], a["w_hr"], lengths)
        grads_wide = lstm_backward(grad_y.float(), h_n.float(), c_n.float(), aw["h0"], aw["c0"], y.float(),
                                   saved.float(), aw["w_hh"], aw["w_hr"], lengths)
    else:
        grads = gru_backward(grad_y, h_n, a["h0"], y, saved, a["w_hh"], lengths)
        grads_wide = gru_backward(grad_y.float(), h_n.float(), aw["h0"], y.float(), saved.float(), aw["w_hh"], lengths)
    for g, gw in zip(grads, grads_wide, strict=True):
        assert g.dtype == dtype and torch.equal(g, gw.to(dtype))


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("cell,proj", CELLS, ids=CELL_IDS)
@pytest.mark.parametrize("which", ["T", "B", "H"])
def test_empty(device, cell, proj, which):
    """T, B or H zero: the C API is not called; outputs of the right shapes,
    h_n / c_n copies of h0 / c0, gradients of every input's shape (grad_h0 =
    grad_h_n, zero weight gradients)."""
    if proj and which == "H":
        pytest.skip("a projection needs hidden >= 1")
    T, B, H = {"T": (0, 3, 4), "B": (4, 0, 4), "H": (4, 3, 0)}[which]
    P = 2 if proj else 0
    inputs = {k: v.requires_grad_() for k, v in present(make_inputs(cell, T, B, H, P, device=device)).items()}
    full = {**dict.fromkeys(("b_hh", "c0", "w_hr")), **inputs}
    y, h_n, c_n, saved = run(cell, full, torch.zeros(B, dtype=torch.long) if which == "B" else None, save=True)
    assert y.shape == (T, B, P or H) and saved.shape == (T, B, (5 if cell == "lstm" else 4) * H)
    assert torch.equal(h_n, full["h0"]) and (h_n.numel() == 0 or h_n.data_ptr() != full["h0"].data_ptr())
    outs = [o for o in (y, h_n, c_n) if o is not None]
    grads = torch.autograd.grad(sum(o.sum() for o in outs), list(inputs.values()), allow_unused=True)
    for (name, t), g in zip(inputs.items(), grads):
        assert g is not None and g.shape == t.shape, name
        if T == 0:  # h_n and c_n are h0 and c0; no step to send the others a gradient
            assert (g == (1 if name in ("h0", "c0") else 0)).all(), name


def other_device(t, good=None):
    return t.cpu() if t.is_cuda else t.cuda()


# (the op, what to change in the good arguments (a function of the argument
# and of all the good ones), the expected message); the good arguments:
# T = 4, B = 3, H = 5, float32, lengths [4, 2, 1].
BAD_ARGS = [
    ("lstm", {"xp": lambda a, g: a[0]}, r"prnn::lstm: xp must be 3-D \[steps, batch, 4\*hidden\], got 2-D"),
    ("lstm", {"xp": lambda a, g: a[..., :19]}, r"prnn::lstm: xp must have shape \[steps, batch, 4\*hidden\]: its last size must be a multiple of 4, got \[4, 3, 19\]"),
    ("lstm", {"xp": lambda a, g: a.long()}, r"prnn::lstm: xp must be float32, float64, float16 or bfloat16, got Long"),
    ("lstm", {"h0": lambda a, g: a[0]}, r"prnn::lstm: h0 must be 2-D \[batch, hidden\], got 1-D"),
    ("lstm", {"h0": lambda a, g: a[:2]}, r"prnn::lstm: h0 must have shape \[batch=3, hidden=5\], got \[2, 5\]"),
    ("lstm", {"h0": lambda a, g: a.double()}, r"prnn::lstm: h0 must have the dtype of xp \(Float\), got Double"),
    ("lstm", {"c0": lambda a, g: a[:, :4]}, r"prnn::lstm: c0 must have shape \[batch=3, hidden=5\], got \[3, 4\]"),
    ("lstm", {"c0": lambda a, g: a.half()}, r"prnn::lstm: c0 must have the dtype of xp \(Float\), got Half"),
    ("lstm", {"w_hh": lambda a, g: a[:, :4]}, r"prnn::lstm: w_hh must have shape \[4\*hidden=20, hidden=5\], got \[20, 4\]"),
    ("lstm", {"w_hh": lambda a, g: a[0]}, r"prnn::lstm: w_hh must be 2-D \[4\*hidden, hidden\], got 1-D"),
    ("lstm", {"b_hh": lambda a, g: a[:19]}, r"prnn::lstm: b_hh must have shape \[4\*hidden=20\], got \[19\]"),
    ("lstm", {"b_hh": lambda a, g: a.view(4, 5)}, r"prnn::lstm: b_hh must be 1-D \[4\*hidden\], got 2-D"),
    ("lstm", {"w_hr": lambda a, g: g["xp"].new_zeros(2, 5)}, r"prnn::lstm: h0 must have shape \[batch=3, proj_size=2\], got \[3, 5\]"),
    ("lstm", {"w_hr": lambda a, g: g["xp"].new_zeros(2, 4)}, r"prnn::lstm: w_hr must have shape \[proj_size >= 1, hidden=5\], got \[2, 4\]"),
    ("lstm", {"w_hr": lambda a, g: g["xp"].new_zeros(0, 5)}, r"prnn::lstm: w_hr must have shape \[proj_size >= 1, hidden=5\], got \[0, 5\]"),
    ("lstm", {"w_hr": lambda a, g: g["xp"].new_zeros(2, 5, dtype=torch.float64)}, r"prnn::lstm: w_hr must have the dtype of xp \(Float\), got Double"),
    ("lstm", {"lengths": lambda a, g: torch.tensor([4, 5, 1])}, r"prnn::lstm: lengths must be in \[0, steps=4\], got values in \[1, 5\]"),
    ("lstm", {"lengths": lambda a, g: torch.tensor([4, -1, 1])}, r"prnn::lstm: lengths must be in \[0, steps=4\], got values in \[-1, 4\]"),
    ("lstm", {"lengths": lambda a, g: a.int()}, r"prnn::lstm: lengths must be int64, got Int"),
    ("lstm", {"lengths": lambda a, g: a[:2]}, r"prnn::lstm: lengths must have shape \[batch=3\], got \[2\]"),
    pytest.param("lstm", {"c0": other_device}, r"prnn::lstm: c0 must be on the device of xp \((cpu|cuda:0)\), got (cuda:0|cpu)", marks=needs_cuda),
    pytest.param("lstm", {"lengths": lambda a, g: a.cuda()}, r"prnn::lstm: lengths must be a CPU tensor .*, got one on cuda:0", marks=needs_cuda),
    ("gru", {"xp": lambda a, g: a[..., :14]}, r"prnn::gru: xp must have shape \[steps, batch, 3\*hidden\]: its last size must be a multiple of 3, got \[4, 3, 14\]"),
    ("gru", {"h0": lambda a, g: a[:, :4]}, r"prnn::gru: h0 must have shape \[batch=3, hidden=5\], got \[3, 4\]"),
    ("gru", {"w_hh": lambda a, g: a[:12]}, r"prnn::gru: w_hh must have shape \[3\*hidden=15, hidden=5\], got \[12, 5\]"),
    ("gru", {"b_hh": lambda a, g: g["xp"].new_zeros(20)}, r"prnn::gru: b_hh must have shape \[3\*hidden=15\], got \[20\]"),
    ("gru", {"w_hh": lambda a, g: a.double()}, r"prnn::gru: w_hh must have the dtype of xp \(Float\), got Double"),
    ("gru", {"lengths": lambda a, g: torch.tensor([4, 2, 9])}, r"prnn::gru: lengths must be in \[0, steps=4\], got values in \[2, 9\]"),
    pytest.param("gru", {"w_hh": other_device}, r"prnn::gru: w_hh must be on the device of xp \((cpu|cuda:0)\), got (cuda:0|cpu)", marks=needs_cuda),
    ("lstm_backward", {"grad_y": lambda a, g: a[..., :4]}, r"prnn::lstm_backward: grad_y must have the shape of y \[4, 3, 5\], got \[4, 3, 4\]"),
    ("lstm_backward", {"grad_y": lambda a, g: a.double()}, r"prnn::lstm_backward: grad_y must have the dtype of y \(Float\), got Double"),
    ("lstm_backward", {"y": lambda a, g: a.long()}, r"prnn::lstm_backward: y must be float32, float64, float16 or bfloat16, got Long"),
    ("lstm_backward", {"saved": lambda a, g: g["y"].new_zeros(0)}, r"prnn::lstm_backward: saved must be 3-D \[steps, batch, saved values\*hidden\], got 1-D"),
    ("lstm_backward", {"saved": lambda a, g: a[..., :20]}, r"prnn::lstm_backward: saved must have shape \[steps=4, batch=3, 5\*hidden=25\] \(the forward's, with save=True\), got \[4, 3, 20\]"),
    ("lstm_backward", {"grad_h_n": lambda a, g: a[:, :4]}, r"prnn::lstm_backward: grad_h_n must have shape \[batch=3, hidden=5\], got \[3, 4\]"),
    ("lstm_backward", {"grad_c_n": lambda a, g: a.double()}, r"prnn::lstm_backward: grad_c_n must have the dtype of y \(Float\), got Double"),
    ("lstm_backward", {"c0": lambda a, g: a[:2]}, r"prnn::lstm_backward: c0 must have shape \[batch=3, hidden=5\], got \[2, 5\]"),
    ("lstm_backward", {"w_hh": lambda a, g: a[:19]}, r"prnn::lstm_backward: w_hh must have shape \[4\*hidden, hidden\]: its first size must be a multiple of 4, got \[19, 5\]"),
    ("lstm_backward", {"w_hh": lambda a, g: a[:16]}, r"prnn::lstm_backward: y must have shape \[steps, batch, hidden=4\], got \[4, 3, 5\]"),
    ("lstm_backward", {"lengths": lambda a, g: torch.tensor([4, 2, 7])}, r"prnn::lstm_backward: lengths must be in \[0, steps=4\], got values in \[2, 7\]"),
    pytest.param("lstm_backward", {"saved": other_device}, r"prnn::lstm_backward: saved must be on the device of y \((cpu|cuda:0)\), got (cuda:0|cpu)", marks=needs_cuda),
    ("gru_backward", {"saved": lambda a, g: g["y"].new_zeros(4, 3, 25)}, r"prnn::gru_backward: saved must have shape \[steps=4, batch=3, 4\*hidden=20\] \(the forward's, with save=True\), got \[4, 3, 25\]"),
    ("gru_backward", {"grad_h_n": lambda a, g: a[:1]}, r"prnn::gru_backward: grad_h_n must have shape \[batch=3, hidden=5\], got \[1, 5\]"),
    ("gru_backward", {"h0": lambda a, g: a.half()}, r"prnn::gru_backward: h0 must have the dtype of y \(Float\), got Half"),
    ("gru_backward", {"lengths": lambda a, g: a.int()}, r"prnn::gru_backward: lengths must be int64, got Int"),
]


def good_args(op, device):
    """Good arguments of `op` (a dict in schema order) and the op."""
    cell = op.split("_")[0]
    inputs = make_inputs(cell, 4, 3, 5, dtype=torch.float32, device=device)
    lengths = torch.tensor([4, 2, 1])
    if op in ("lstm", "gru"):
        names = ["xp", "b_hh", "h0", "c0", "w_hh", "w_hr"] if cell == "lstm" else ["xp", "b_hh", "h0", "w_hh"]
        return {**{n: inputs[n] for n in names}, "lengths": lengths}, getattr(torch.ops.prnn, op)
    y, h_n, c_n, saved = run(cell, inputs, lengths, save=True)
    grads = {"grad_y": torch.randn_like(y), "grad_h_n": torch.randn_like(h_n)}
    if cell == "lstm":
        args = {**grads, "grad_c_n": torch.randn_like(c_n), "h0": inputs["h0"], "c0": inputs["c0"], "y": y,
                "saved": saved, "w_hh": inputs["w_hh"], "w_hr": None, "lengths": lengths}
    else:
        args = {**grads, "h0": inputs["h0"], "y": y, "saved": saved, "w_hh": inputs["w_hh"], "lengths": lengths}
    return args, getattr(torch.ops.prnn, op)


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("op,change,message", BAD_ARGS)
def test_bad_args(device, op, change, message):
    good, fn = good_args(op, device)
    bad = {k: change[k](v, good) if k in change else v for k, v in good.items()}
    with pytest.raises(RuntimeError, match=message):
        fn(*bad.values())
    expected = fn(*good.values())  # still works
    assert all(torch.isfinite(t).all() for t in expected)
    if device == "cuda":
        torch.cuda.synchronize()  # an error the bad call left in the context surfaces here


def test_autocast_cpu():
    """Under CPU autocast the forward ops run in the autocast dtype (the
    inputs cast, lengths untouched), as nn.LSTM / nn.GRU do."""
    for cell in ("lstm", "gru"):
        inputs = make_inputs(cell, 4, 2, 3, dtype=torch.float32)
        lengths = torch.tensor([4, 1])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs = run(cell, inputs, lengths, save=True)
        cast = {k: v.bfloat16() if v is not None else None for k, v in inputs.items()}
        for o, e in zip(outs, run(cell, cast, lengths, save=True)):
            assert o is None or (o.dtype == torch.bfloat16 and torch.equal(o, e))


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("cell,proj", CELLS, ids=CELL_IDS)
def test_compile_dynamic(device, cell, proj):
    """torch.compile(fullgraph=True, dynamic=True) of a loss of the op: the
    eager values and gradients, through the fake kernels with symbolic T and B."""
    torch._dynamo.reset()
    inputs = {k: v.requires_grad_() for k, v in present(make_inputs(cell, 5, 3, 4, proj_size_for(4, proj), torch.float32, device)).items()}
    names = list(inputs)

    def f(lengths, *tensors):
        y, h_n, c_n, _ = run(cell, {**dict.fromkeys(("b_hh", "c0", "w_hr")), **dict(zip(names, tensors))}, lengths)
        return y.square().sum() + h_n.sin().sum() + (c_n.sum() if c_n is not None else 0)

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for T, B in ((5, 3), (3, 2)):
        lengths = torch.randint(0, T + 1, (B,))
        tensors = [t[:T, :B] if n == "xp" else t[:B] if n in ("h0", "c0") else t for n, t in inputs.items()]
        eager = [f(lengths, *tensors)] + list(torch.autograd.grad(f(lengths, *tensors), list(inputs.values())))
        got = [compiled(lengths, *tensors)] + list(torch.autograd.grad(compiled(lengths, *tensors), list(inputs.values())))
        for name, g, e in zip(["loss", *names], got, eager):
            assert rel_err(g, e) < 1e-5, name
    torch._dynamo.reset()


def test_plan_cpu():
    # LSTM: (4 + 1) x hidden workspace (one sequence's gates and m); rows of W_hh forward, of W_hh^T backward.
    plan = torch_prnn.plan(33, batch=4, steps=10, cell="lstm")
    assert plan == {"tier": "cpu_reference", "workspace_bytes": 5 * 33 * 4, "grid": 1, "block": 1,
                    "rows_per_cta": 4 * 33, "smem_bytes": 0, "fused_input_projection": False,
                    "module": "prnn"}  # the hand-over is off in the tests (conftest; test_crossover.py)
    assert torch_prnn.plan(33, cell="lstm", proj_size=8, backward=True)["rows_per_cta"] == 8
    gru_plan = torch_prnn.plan(33, batch=4, dtype=torch.float64, cell="gru", lengths=True)
    assert gru_plan["workspace_bytes"] == 4 * 33 * 8 and gru_plan["rows_per_cta"] == 3 * 33
    # float16 / bfloat16 run in float32 on the CPU, which fuses no layer's projection.
    assert torch_prnn.plan(33, batch=4, steps=10, cell="lstm", dtype=torch.bfloat16, input_size=20) == plan
    # The Elman call is unchanged.
    assert torch_prnn.plan(33, batch=4, steps=10)["workspace_bytes"] == 2 * 4 * 33 * 4
    assert torch_prnn.plan(2**30, cell="gru")["tier"] == "none"


def test_plan_errors():
    with pytest.raises(ValueError, match="prnn::plan: cell must be 'rnn', 'lstm' or 'gru', got 'LSTM'"):
        torch_prnn.plan(8, cell="LSTM")
    with pytest.raises(ValueError, match="prnn::plan: proj_size is for cell='lstm' only, got proj_size=2 with cell='gru'"):
        torch_prnn.plan(8, cell="gru", proj_size=2)
    with pytest.raises(ValueError, match="prnn::plan: proj_size must be >= 0, got -1"):
        torch_prnn.plan(8, cell="lstm", proj_size=-1)


@pytest.mark.parametrize("cell,proj", CELLS, ids=CELL_IDS)
def test_randomized(cell, proj):
    """Fresh sizes, lengths and values each run (the seed is printed, and
    named in a failure): float32 against torch's layer in float64, within 10x
    torch's own float32 error."""
    for _ in range(3):
        seed = random.SystemRandom().randrange(2**31)
        print(f"test_randomized[{cell}{'-proj' if proj else ''}]: seed {seed}")
        rng = random.Random(seed)
        T, B, I, H = rng.randint(1, 24), rng.randint(1, 9), rng.randint(1, 12), rng.randint(2 if proj else 1, 40)
        lengths = torch.tensor([rng.randint(1, T) for _ in range(B)]) if rng.random() < 0.5 else None
        for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
            check_against_torch(cell, proj, device, torch.float32, T, B, I, H, bias=rng.random() < 0.8,
                                lengths=lengths, seed=seed, what=f"seed {seed} T={T} B={B} I={I} H={H} {device}: ")


@needs_cuda
@pytest.mark.parametrize("cell,proj", CELLS, ids=CELL_IDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_reduced_precision_cuda(cell, proj, dtype):
    """16-bit on the GPU against the loop in float64 on the same (rounded)
    inputs, over T = 64: DESIGN.md's bound for 16 bits."""
    T, B, H = 64, 4, 48
    inputs = make_inputs(cell, T, B, H, proj_size_for(H, proj), dtype, "cuda")
    lengths = torch.tensor([T, 0, 17, 40])
    y, h_n, c_n, _ = run(cell, inputs, lengths)
    ref = reference(cell, **{k: v.cpu() if v is not None else None for k, v in inputs.items()}, lengths=lengths)
    for o, r in zip((y, h_n, c_n), ref):
        if o is not None:
            assert o.dtype == dtype and rel_err(o, r) < TOL[dtype]


# (H, B, T, bias): H at the cluster family's boundaries (K extent 128 KT, 8 KT
# units a CTA, at most 16 CTAs), batches of one group, of several, of an odd
# size and of full groups of 8 (B = 56, 64: where the hand-over's limits put
# the family), T from 1 (no exchange) up, with and without b_hh.
CLUSTER_CASES = [(1, 1, 24, True), (7, 3, 1, True), (33, 9, 2, False), (128, 4, 3, True), (129, 1, 24, True),
                 (200, 17, 24, False), (256, 8, 24, True), (256, 64, 24, True), (257, 2, 24, True), (384, 5, 24, True),
                 (385, 4, 24, True), (512, 4, 24, True), (512, 9, 24, True), (512, 56, 24, True)]


@needs_cuda
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_cluster_family_cuda(cell, dtype, monkeypatch):
    """The gated cluster family (16 bits, H <= 512, sm_90), forward and
    backward, against the loop and its gradients in float64 on the same
    rounded inputs, with lengths (0, partial, full) and non-contiguous xp; its
    saved values and gradients against the persistent family's too (the
    backward exchanges gate gradients in 16 bits, the persistent family in
    float32)."""
    for H, B, T, bias in CLUSTER_CASES:
        for backward in (False, True):
            p = torch_prnn.plan(H, batch=B, cell=cell, dtype=dtype, device="cuda", backward=backward)
            if cluster_tier_available() and B <= 16:  # larger batches: as many clusters as the GPU holds at once
                assert p["tier"] == "persistent_cluster", (H, B, backward, p)
        inputs = make_inputs(cell, T, B, H, 0, dtype, "cuda", bias=bias, seed=H + B)
        inputs["xp"] = strided_copy(inputs["xp"].transpose(0, 1), 1).transpose(0, 1)  # batch-major
        lengths = torch.tensor([min((T, 0, 17, 1)[b % 4], T) for b in range(B)])
        y, h_n, c_n, saved = run(cell, inputs, lengths, save=True)
        grads = grads_of_a_pass(cell, inputs, lengths)
        exact = exact_copy(inputs)
        check_outputs(cell, (y, h_n, c_n), exact, lengths, dtype, (H, B))
        monkeypatch.setenv("PRNN_DISABLE_CLUSTER_TIER", "1")  # the gated planner reads it at each plan
        assert torch_prnn.plan(H, batch=B, cell=cell, dtype=dtype, device="cuda")["tier"] != "persistent_cluster"
        y2, h_n2, c_n2, saved2 = run(cell, inputs, lengths, save=True)
        grads2 = grads_of_a_pass(cell, inputs, lengths)
        monkeypatch.delenv("PRNN_DISABLE_CLUSTER_TIER")
        assert rel_err(saved, saved2) < TOL[dtype], (H, B, rel_err(saved, saved2))
        assert rel_err(y, y2) < TOL[dtype], (H, B)
        # Gradients against float64 within the persistent family's own error, twice over (each family
        # reads the 16-bit saved values; this one also rounds the exchanged gate gradients to 16 bits).
        ref_grads = grads_of_a_pass(cell, exact, lengths, weight_dtype=dtype)
        for name in grads:
            err, err2 = rel_err(grads[name], ref_grads[name]), rel_err(grads2[name], ref_grads[name])
            print(f"{cell} {dtype} H={H} B={B} grad {name}: cluster {err:.2e}, persistent {err2:.2e}")
            assert err < max(TOL[dtype], 2 * err2), (H, B, name, err, err2)


# (H, B, T, bias): the grid family's K extents (128 KT, KT 1 to 8) and CTA
# boundaries (16 units), one group and several (B = 16 at H = 1024: two groups
# of 64 CTAs), T from 1 up, with and without b_hh. Up to H = 512 it runs where
# clusters do not: the cluster tier is disabled for those cases.
GRID_CASES = [(1, 1, 3, True), (17, 3, 24, True), (200, 9, 2, False), (512, 2, 1, True), (513, 4, 24, True),
              (640, 17, 3, True), (1000, 3, 24, False), (1024, 4, 24, True), (1024, 16, 5, True)]


def off_the_grid_batch(H, B, cell, dtype):
    """A batch larger than B whose backward the grid family declines (more
    groups than the GPU holds at once) and the persistent family runs, or
    None if there is none up to 4097."""
    for padded in (2 ** k + 1 for k in range(1, 13)):
        if padded > B and torch_prnn.plan(H, batch=padded, cell=cell, dtype=dtype, device="cuda",
                                          backward=True)["tier"] == "persistent_shared":
            return padded
    return None


@needs_cuda
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_grid_family_cuda(cell, dtype, monkeypatch):
    """The gated grid family (16 bits, H <= 1024, sm_80 and later, the state
    exchanged through L2), forward and backward: check_grid_family."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    # the backward's largest kernels (LSTM H = 1024) need 140 KB of shared memory a CTA
    backward_fits = getattr(props, "shared_memory_per_block_optin", 0) >= 140 * 1024
    check_grid_family(cell, dtype, GRID_CASES, lambda H, B, backward: backward_fits or not backward, monkeypatch)


# (H, B, T, bias) for the float32 grid family (gated_ffma.cu): its K extents
# (forward 256, 512, 1024; backward 1024, 2048, 4096), CTA boundaries (8
# units), groups of 1, 2, 4 and 8 sequences, one group and several (H <= 528
# holds two groups of up to 8 on 132 SMs), T from 1 up, with and without b_hh.
FFMA_CASES = [(1, 1, 3, True), (9, 3, 24, True), (200, 9, 2, False), (256, 1, 5, True), (257, 4, 24, True),
              (512, 2, 1, True), (513, 5, 24, True), (520, 4, 5, True), (640, 8, 3, True), (1000, 3, 24, False),
              (1024, 1, 7, True), (1024, 2, 24, True), (1024, 8, 24, True)]


@needs_cuda
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_ffma_family_cuda(cell, monkeypatch):
    """The gated float32 grid family (W_hh in registers as FFMA operands, the
    state exchanged through L2 as tagged float32 words), forward and backward:
    check_grid_family. It takes a batch whose groups of up to 8 sequences all
    fit at once, a CTA an SM (8 units a CTA); its backward is planned only
    with PRNN_GATED_FFMA=1 (slower than the persistent family's:
    bench/NOTES.md step 75)."""
    monkeypatch.setenv("PRNN_GATED_FFMA", "1")  # the gated planner reads it at each plan
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    # the backward's largest kernels (8 sequences, K = 4096) need 130 KiB of shared memory a CTA
    backward_fits = getattr(props, "shared_memory_per_block_optin", 0) >= 134 * 1024
    check_grid_family(cell, torch.float32, FFMA_CASES,
                      lambda H, B, backward: -(-H // 8) * -(-B // 8) <= props.multi_processor_count
                      and (backward_fits or not backward), monkeypatch)


@needs_cuda
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_ffma_family_takes_the_forward_by_default(cell, monkeypatch):
    """By default the float32 grid family takes the forward and the persistent
    family the backward, which reads the forward's saved values: a training
    call through both against the float64 loop; PRNN_GATED_FFMA=0 leaves
    both passes to the persistent family."""
    H, B, T = 1024, 4, 9
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if torch.cuda.get_device_capability() < (8, 0) or sms < H // 8:
        pytest.skip("the float32 grid family needs sm_80 and an SM for each of its 128 CTAs at H = 1024")
    monkeypatch.delenv("PRNN_GATED_FFMA", raising=False)
    tiers = [torch_prnn.plan(H, batch=B, cell=cell, dtype=torch.float32, device="cuda", backward=bw)["tier"]
             for bw in (False, True)]
    assert tiers == ["persistent_registers", "persistent_shared"], tiers
    monkeypatch.setenv("PRNN_GATED_FFMA", "0")
    assert torch_prnn.plan(H, batch=B, cell=cell, dtype=torch.float32, device="cuda")["tier"] == "persistent_shared"
    monkeypatch.delenv("PRNN_GATED_FFMA")
    inputs = make_inputs(cell, T, B, H, 0, torch.float32, "cuda", seed=H + B)
    lengths = torch.tensor([T, 1, 5, 0])
    y, h_n, c_n, _ = run(cell, inputs, lengths)
    exact = exact_copy(inputs)
    check_outputs(cell, (y, h_n, c_n), exact, lengths, torch.float32)
    check_grads(cell, inputs, exact, lengths, grads_of_a_pass(cell, inputs, lengths), torch.float32)


def check_grid_family(cell, dtype, cases, family_takes, monkeypatch):
    """A grid family against the loop and its gradients in float64 on the same
    rounded inputs, with lengths (0, partial, full) and non-contiguous xp,
    and its saved values (which the backward reads) against the float64
    pass's; family_takes(H, B, backward): whether the plan must name it
    (on sm_80 and later). The gradients must be within twice the persistent
    family's own error, which runs the same sequences padded with sequences
    of length 0 to a batch the grid family declines, or twice the error of
    the same pass on the CPU in the same dtype."""
    for H, B, T, bias in cases:
        if H <= 512:
            monkeypatch.setenv("PRNN_DISABLE_CLUSTER_TIER", "1")  # the gated planner reads it at each plan
        for backward in (False, True):
            p = torch_prnn.plan(H, batch=B, cell=cell, dtype=dtype, device="cuda", backward=backward)
            if torch.cuda.get_device_capability() >= (8, 0) and family_takes(H, B, backward):
                assert p["tier"] == "persistent_registers", (H, B, backward, p)
        inputs = make_inputs(cell, T, B, H, 0, dtype, "cuda", bias=bias, seed=H + B)
        inputs["xp"] = strided_copy(inputs["xp"].transpose(0, 1), 1).transpose(0, 1)  # batch-major
        lengths = torch.tensor([min((T, 0, 17, 1)[b % 4], T) for b in range(B)])
        y, h_n, c_n, saved = run(cell, inputs, lengths, save=True)
        grads = grads_of_a_pass(cell, inputs, lengths)
        padded = off_the_grid_batch(H, B, cell, dtype)
        grads2 = grads_of_a_pass(cell, inputs, lengths, pad_to=padded) if padded else None
        monkeypatch.delenv("PRNN_DISABLE_CLUSTER_TIER", raising=False)
        exact = exact_copy(inputs)
        check_outputs(cell, (y, h_n, c_n), exact, lengths, dtype, (H, B))
        saved64 = run(cell, exact, lengths, save=True)[3]
        assert rel_err(saved, saved64) < TOL[dtype], (H, B, rel_err(saved, saved64))
        check_grads(cell, inputs, exact, lengths, grads, dtype, (H, B, f"persistent at batch {padded}"), grads2)


def exact_copy(inputs):
    """The inputs as float64 on the CPU: the reference's exact inputs."""
    return {k: v.detach().cpu().double() if v is not None else None for k, v in inputs.items()}


def check_outputs(cell, outputs, exact, lengths, dtype, what=()):
    """y, h_n (and c_n) against the float64 loop on the exact inputs, each
    within TOL[dtype] and in dtype."""
    for name, o, r in zip(("y", "h_n", "c_n"), outputs, reference(cell, **exact, lengths=lengths)):
        if o is not None:
            assert o.dtype == dtype and rel_err(o, r) < TOL[dtype], (*what, name, rel_err(o, r))


def check_grads(cell, inputs, exact, lengths, grads, dtype, what=(), other_grads=None):
    """A pass's gradients against the float64 pass's on the exact inputs
    (weighted in dtype): within TOL[dtype], twice the same pass's error on
    the CPU in dtype (a gradient whose terms cancel, as grad_h0 at H = 1,
    carries its own rounding error), or twice another family's error on the
    same inputs (other_grads)."""
    ref_grads = grads_of_a_pass(cell, exact, lengths, weight_dtype=dtype)
    cpu_grads = grads_of_a_pass(cell, {k: v.detach().cpu() if v is not None else None for k, v in inputs.items()},
                                lengths)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        err, err_cpu = rel_err(grads[name], ref_grads[name]), rel_err(cpu_grads[name], ref_grads[name])
        err_other = rel_err(other_grads[name], ref_grads[name]) if other_grads else TOL[dtype] / 2
        print(f"{cell} {dtype} {what} grad {name}: {err:.2e}, other {err_other:.2e}, cpu {err_cpu:.2e}")
        assert err < max(TOL[dtype], 2 * err_other, 2 * err_cpu), (*what, name, err, err_other, err_cpu)


def grads_of_a_pass(cell, inputs, lengths, weight_dtype=None, pad_to=None):
    """{name: gradient} of a fixed weighting of y, h_n (and c_n) for every
    input of the op. The weights are drawn on the CPU and rounded to
    weight_dtype (default: the outputs'), so that a pass in float64 on the CPU
    gets the gradients a 16-bit pass on the GPU does. With pad_to, the batch
    runs padded to pad_to sequences with sequences of length 0, which change
    neither the weights' gradients nor the others' (a batch size picks the
    family that runs the pass)."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in present(inputs).items()}
    args, B = {**dict.fromkeys(("b_hh", "c0", "w_hr")), **leaves}, lengths.numel()
    if pad_to is not None:
        def pad(t, dim):
            shape = list(t.shape)
            shape[dim] = pad_to - B
            return torch.cat([t, t.new_zeros(shape)], dim)
        args.update({k: pad(args[k], dim) for k, dim in (("xp", 1), ("h0", 0), ("c0", 0)) if args[k] is not None})
        lengths = torch.cat([lengths, lengths.new_zeros(pad_to - B)])
    y, h_n, c_n, _ = run(cell, args, lengths)
    if pad_to is not None:
        y, h_n, c_n = y[:, :B], h_n[:B], c_n[:B] if c_n is not None else None
    gen = torch.Generator().manual_seed(7)
    weight = lambda o: torch.randn(o.shape, generator=gen).to(weight_dtype or o.dtype).to(o.device, torch.float64)
    loss = sum((o.double() * weight(o)).sum() for o in (y, h_n, c_n) if o is not None)
    return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
