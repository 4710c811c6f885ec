"""prnn::gated_layer, a gated layer's forward with its input projection for
calls that need no gradient (what prnn::layers runs for a PersistentLSTM
without proj_size or a PersistentGRU on CUDA under no_grad): its
registrations (opcheck), the same bits as the GEMM and prnn::lstm / prnn::gru
on the CPU, errors; on CUDA the few-steps kernel at T = 1 against nn.LSTM /
nn.GRU in float64, and which calls take it."""

import pytest
import torch
from torch import nn

import torch_prnn
from conftest import TOL, needs_cuda, rel_err
from test_short_path import OpLog  # its ops: (name, output shapes)

gated_layer = torch.ops.prnn.gated_layer.default
devices = ["cpu", pytest.param("cuda", marks=needs_cuda)]
MODES = {"lstm": "LSTM", "gru": "GRU"}
MODULES = {"lstm": (nn.LSTM, torch_prnn.PersistentLSTM), "gru": (nn.GRU, torch_prnn.PersistentGRU)}


def layer_inputs(cell, T, B, I, H, dtype=torch.float32, device="cpu", bias=True, seed=0):
    """x, w_ih, b_ih, b_hh, h0, c0 (None for a GRU), w_hh in nn's ranges; x
    every other sequence of a wider batch (strided)."""
    gen = torch.Generator().manual_seed(seed)
    G = 4 if cell == "lstm" else 3

    def uniform(*shape, scale=1.0):
        return ((torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1) * scale).to(device, dtype)

    k = H**-0.5
    x = uniform(T, 2 * B, I)[:, ::2]
    b_ih, b_hh = (uniform(G * H, scale=k), uniform(G * H, scale=k)) if bias else (None, None)
    c0 = uniform(B, H) if cell == "lstm" else None
    return x, uniform(G * H, I, scale=k), b_ih, b_hh, uniform(B, H), c0, uniform(G * H, H, scale=k)


def the_ops(cell, x, w_ih, b_ih, b_hh, h0, c0, w_hh):
    """What gated_layer computes without the fused kernel: the GEMM, then the gated op."""
    xp = torch.nn.functional.linear(x, w_ih, b_ih)
    if cell == "lstm":
        y, h_n, c_n, _ = torch.ops.prnn.lstm(xp, b_hh, h0, c0, w_hh, None, None)
        return y, h_n, c_n
    y, h_n, _ = torch.ops.prnn.gru(xp, b_hh, h0, w_hh, None)
    return y, h_n, None


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("cell", MODES)
@pytest.mark.parametrize("steps", [1, 3])
def test_opcheck(device, cell, steps):
    """Schema, fake kernel and dispatch: at T = 1 on CUDA the few-steps
    kernel, at T = 3 (and on the CPU) the ops."""
    args = layer_inputs(cell, steps, 3, 6, 5, device=device)
    torch.library.opcheck(gated_layer, (*args, MODES[cell]))
    torch.library.opcheck(gated_layer, (*layer_inputs(cell, steps, 2, 4, 3, device=device, bias=False), MODES[cell]))


@pytest.mark.parametrize("cell", MODES)
@pytest.mark.parametrize("bias", [True, False])
def test_cpu_is_the_ops(cell, bias):
    """On the CPU gated_layer is the GEMM and the gated op: the same bits; a
    GRU's c_n is a [0] tensor."""
    args = layer_inputs(cell, 4, 3, 6, 5, bias=bias)
    got = gated_layer(*args, MODES[cell])
    expected = the_ops(cell, *args)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    if cell == "lstm":
        assert torch.equal(got[2], expected[2])
    else:
        assert got[2].shape == (0,)


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("cell", MODES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("steps, batch", [(3, 2), (1, 17), (7, 1)])
def test_batch_first_input_is_the_ops(device, cell, bias, dtype, steps, batch):
    """x as a batch_first module passes it (a transposed view, whose leading
    dimensions do not fold into rows without a copy, or with T or B of 1 a
    contiguous one that still fails the fold test) and weights that require
    grad, under no_grad: the bits of the regular path, whose F.linear above
    autograd folds x into one GEMM (below autograd at::matmul would run a
    batched GEMM) or, contiguous with a bias, runs one addmm. B = 17 at
    T = 1: past the few-steps kernel, the ops on CUDA too."""
    x, w_ih, b_ih, b_hh, h0, c0, w_hh = layer_inputs(cell, steps, batch, 6, 5, dtype, device, bias)
    x = x.transpose(0, 1).contiguous().transpose(0, 1)  # [T, B, I] with the strides of a transposed [B, T, I]
    w_ih.requires_grad_()
    with torch.no_grad():
        got = gated_layer(x, w_ih, b_ih, b_hh, h0, c0, w_hh, MODES[cell])
        expected = the_ops(cell, x, w_ih, b_ih, b_hh, h0, c0, w_hh)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    if cell == "lstm":
        assert torch.equal(got[2], expected[2])


@pytest.mark.parametrize("device", devices)
def test_errors(device):
    x, w_ih, b_ih, b_hh, h0, c0, w_hh = layer_inputs("lstm", 1, 2, 3, 4, device=device)
    with pytest.raises(ValueError, match=r"prnn::gated_layer: mode must be 'LSTM' or 'GRU', got 'RNN'"):
        gated_layer(x, w_ih, b_ih, b_hh, h0, c0, w_hh, "RNN")
    with pytest.raises(RuntimeError, match=r"prnn::gated_layer: c0 must be given for an LSTM and only for one"):
        gated_layer(x, w_ih, b_ih, b_hh, h0, None, w_hh, "LSTM")
    # A malformed call gets the ops' own checks (here prnn::lstm's of h0).
    with pytest.raises(RuntimeError, match=r"prnn::lstm: h0"):
        gated_layer(x, w_ih, b_ih, b_hh, h0[:1], c0, w_hh, "LSTM")


@pytest.mark.parametrize("device", devices)
def test_refuses_gradients(device):
    """A call that would record a graph fails before it runs, naming the
    op; without grad mode, or on tensors that need none, it runs."""
    x, w_ih, b_ih, b_hh, h0, c0, w_hh = layer_inputs("gru", 1, 2, 3, 4, device=device)
    with pytest.raises(RuntimeError, match=r"prnn::gated_layer: not differentiable"):
        gated_layer(x, w_ih.requires_grad_(), b_ih, b_hh, h0, c0, w_hh, "GRU")
    with torch.no_grad():
        y, _, _ = gated_layer(x, w_ih, b_ih, b_hh, h0, c0, w_hh, "GRU")
    assert not y.requires_grad
    with torch.autograd.forward_ad.dual_level(), torch.no_grad():
        dual = torch.autograd.forward_ad.make_dual(x, torch.ones_like(x))
        with pytest.raises(RuntimeError, match=r"prnn::gated_layer: forward-mode AD"):
            gated_layer(dual, w_ih, b_ih, b_hh, h0, c0, w_hh, "GRU")


def twins(cell, I, H, dtype, bias=True, seed=0):
    """nn's layer on CUDA in dtype, ours with its weights, and nn's in float64 on the CPU."""
    torch.manual_seed(seed)
    theirs = MODULES[cell][0](I, H, bias=bias, device="cuda", dtype=dtype)
    ours = MODULES[cell][1].from_lstm(theirs) if cell == "lstm" else MODULES[cell][1].from_gru(theirs)
    exact = MODULES[cell][0](I, H, bias=bias, dtype=torch.float64)
    exact.load_state_dict({k: v.double().cpu() for k, v in theirs.state_dict().items()})
    return theirs, ours, exact


def cell_twin(cell, layer):
    """nn.LSTMCell / nn.GRUCell with `layer`'s weights: torch's other implementation in the
    layer's dtype, which rounds the input projection to it as a GEMM before the cell does."""
    w = layer.weight_ih_l0
    twin = (nn.LSTMCell if cell == "lstm" else nn.GRUCell)(layer.input_size, layer.hidden_size, bias=layer.bias,
                                                            device=w.device, dtype=w.dtype)
    twin.load_state_dict({k.removesuffix("_l0"): v for k, v in layer.state_dict().items()})
    return twin


def rounded_projection_model(cell, exact, x, given, dtype):
    """One step of `exact`'s (float64) weights as the few-steps kernel defines
    it: xp = W_ih x + b_ih rounded to dtype, b_hh on the recurrent side, the
    rest in float64. [y, h_n] (and c_n), shaped as the module's."""
    B, H = x.shape[1], exact.hidden_size
    zeros = x.new_zeros(1, B, H)
    if cell == "lstm":
        h0, c0 = given if given is not None else (zeros, zeros)
    else:
        h0 = given if given is not None else zeros
    b_ih, b_hh = (exact.bias_ih_l0, exact.bias_hh_l0) if exact.bias else (0.0, 0.0)
    xp = (x[0] @ exact.weight_ih_l0.T + b_ih).to(dtype).double()
    hh = h0[0] @ exact.weight_hh_l0.T + b_hh
    if cell == "lstm":
        i, f, g, o = (xp + hh).chunk(4, 1)
        c = torch.sigmoid(f) * c0[0] + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return [h[None], h[None], c[None]]
    (xr, xz, xn), (hr, hz, hn) = xp.chunk(3, 1), hh.chunk(3, 1)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    h = (1 - z) * torch.tanh(xn + r * hn) + z * h0[0]
    return [h[None], h[None]]


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("cell", MODES)
def test_few_steps_module_call(cell, dtype):
    """One timestep a call of PersistentLSTM / PersistentGRU on CUDA under
    no_grad: the few-steps kernel (plan and dispatch say so) at odd sizes,
    with and without bias and hx, both load widths (I and H multiples of a
    16-byte vector or not), B up to 16; output, h_n (and c_n) within TOL of
    a float64 model of what the kernel computes (the input projection rounded
    to the dtype, the rest exact), and against nn's in float64 within TOL or
    4x the largest error of nn's layer, nn's cell (which, like ours, rounds
    the input projection) and that model."""
    # (1024, 1024, 16): where a float32 LSTM's calls of more steps go to nn.LSTM (torch_prnn._crossover).
    for I, H, B, bias in ((1024, 1024, 1, True), (40, 64, 16, False), (7, 33, 3, True), (1, 1, 1, True),
                          (520, 256, 5, True), (1024, 1024, 16, True)):
        assert torch_prnn.plan(H, batch=B, steps=1, dtype=dtype, device="cuda", cell=cell,
                               input_size=I)["tier"] == "few_steps", (I, H, B)
        theirs, ours, exact = twins(cell, I, H, dtype, bias=bias, seed=I + H + B)
        x = torch.randn(1, B, I, device="cuda", dtype=dtype)
        states = (torch.randn(1, B, H, device="cuda", dtype=dtype) for _ in range(2 if cell == "lstm" else 1))
        hx = tuple(states) if cell == "lstm" else next(states)
        for given in (hx, None):
            with torch.no_grad(), OpLog() as log:
                out, state = ours(x, given)
            assert "prnn.gated_layer.default" in [name for name, _ in log.ops], log.ops
            with torch.no_grad():
                ref_out, ref_state = theirs(x, given)
                one = cell_twin(cell, theirs)
                cell_given = None if given is None else (tuple(g[0] for g in given) if cell == "lstm" else given[0])
                cell_state = one(x[0], cell_given)
                cell_outs = [cell_state[0], *cell_state] if cell == "lstm" else [cell_state, cell_state]
                cpu_given = None if given is None else (
                    tuple(s.double().cpu() for s in given) if cell == "lstm" else given.double().cpu())
                e_out, e_state = exact(x.double().cpu(), cpu_given)
            outs = [out, *(state if cell == "lstm" else (state,))]
            refs = [ref_out, *(ref_state if cell == "lstm" else (ref_state,))]
            exacts = [e_out, *(e_state if cell == "lstm" else (e_state,))]
            models = rounded_projection_model(cell, exact, x.double().cpu(), cpu_given, dtype)
            for name, o, r, c, e, m in zip(("output", "h_n", "c_n"), outs, refs, cell_outs, exacts, models):
                o = o.double().cpu()
                what = f"{cell} {dtype} I={I} H={H} B={B} {name}"
                assert rel_err(o, m) < TOL[dtype], f"{what} against the model: {rel_err(o, m):.3g}"
                theirs_err = max(rel_err(r.double().cpu(), e), rel_err(c.double().cpu().reshape(e.shape), e),
                                 rel_err(m, e))
                err = rel_err(o, e)
                assert err < max(TOL[dtype], 4 * theirs_err), f"{what}: {err:.3g} (nn's {theirs_err:.3g})"


@needs_cuda
@pytest.mark.parametrize("cell", MODES)
def test_which_calls_take_it(cell):
    """Only calls that need no gradient run gated_layer: with grad mode on
    and weights that require one, the regular ops run and the gradients
    arrive; at T = 2 (not the few-steps kernel's) under no_grad, gated_layer
    runs the ops and gives their bits."""
    I, H, B = 24, 32, 3
    _, ours, _ = twins(cell, I, H, torch.float32)
    x = torch.randn(1, B, I, device="cuda")
    with OpLog() as log:
        out, _ = ours(x)
    assert "prnn.gated_layer.default" not in [name for name, _ in log.ops]
    out.sum().backward()
    assert all(p.grad is not None for p in ours.parameters())
    x2 = torch.randn(2, B, I, device="cuda")
    with torch.no_grad(), OpLog() as log:
        out2, state2 = ours(x2)
    assert "prnn.gated_layer.default" in [name for name, _ in log.ops]
    with torch.no_grad():
        args = (x2, ours.weight_ih_l0, ours.bias_ih_l0, ours.bias_hh_l0,
                torch.zeros(B, H, device="cuda"), torch.zeros(B, H, device="cuda") if cell == "lstm" else None,
                ours.weight_hh_l0)
        expected = the_ops(cell, *args)
    assert torch.equal(out2, expected[0]) and torch.equal((state2[0] if cell == "lstm" else state2)[0], expected[1])


@pytest.mark.parametrize("cell", MODES)
def test_fake_kernel_raises_what_the_op_raises(cell):
    """One argument changed at a time (tests/test_fake_checks.py's changes):
    the fake kernel and a meta call give the CPU call's outcome, error or
    output shapes."""
    from test_fake_checks import _changes, _fake_outcome, _meta_outcome, _outcome

    args = [*layer_inputs(cell, 3, 2, 4, 5), MODES[cell]]
    op = torch.ops.prnn.gated_layer
    assert _outcome(op, args).startswith("ok") and _outcome(op, args) == _fake_outcome(op, args)
    checked = 0
    for what, changed in _changes(args):
        real = _outcome(op, changed)
        assert _fake_outcome(op, changed) == real, (what, real)
        assert _meta_outcome(op, changed) == real, (what, real)
        checked += not real.startswith("ok")
    assert checked >= 10


@needs_cuda
@pytest.mark.parametrize("cell", MODES)
def test_few_steps_kernel_runs(cell):
    """The module's one-timestep call launches the few-steps kernel and
    nothing of the GEMM path's (the profiler's kernel names); two steps run
    the GEMM and the gated cell's own kernels."""
    _, ours, _ = twins(cell, 64, 96, torch.float32)

    def kernels(steps):
        x = torch.randn(steps, 2, 64, device="cuda")
        with torch.no_grad():
            ours(x)  # warm up
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                ours(x)
                torch.cuda.synchronize()
        return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]

    one = kernels(1)
    assert any("few_steps_kernel" in name for name in one), one
    assert not any("gemm" in name.lower() for name in one), one
    two = kernels(2)
    assert not any("few_steps_kernel" in name for name in two), two


@pytest.mark.parametrize("device", devices)
def test_autocast(device):
    """Under autocast it computes in the autocast dtype, as prnn::lstm / prnn::gru do."""
    args = layer_inputs("lstm", 1, 2, 3, 4, device=device)
    with torch.autocast(device, dtype=torch.bfloat16), torch.no_grad():
        y, h_n, c_n = gated_layer(*args, "LSTM")
        expected = the_ops("lstm", *args)
    assert y.dtype == h_n.dtype == c_n.dtype == torch.bfloat16 == expected[0].dtype
