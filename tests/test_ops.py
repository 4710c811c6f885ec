"""prnn::forward / prnn::backward / prnn::layer / prnn::plan: values against
a float64 loop, layouts, registrations (opcheck, gradcheck), errors, empty
sizes."""

import pytest
import torch

import torch_prnn
from conftest import assert_close, devices, layer_reference, make_op_inputs, needs_cuda, reference_forward

forward, backward, layer = torch.ops.prnn.forward, torch.ops.prnn.backward, torch.ops.prnn.layer


def random_lengths(T, B):
    lengths = torch.randint(0, T + 1, (B,))
    lengths[0] = T
    return lengths


def check_against_reference(xp, h0, w, lengths, nonlinearity, dtype):
    """Forward values and the gradients of a random loss of y (grad_y is
    random, so every delta_t matters) against autograd through the loop."""
    y, h_n = forward(xp, h0, w, lengths, nonlinearity)
    assert y.dtype == dtype and y.shape == xp.shape and y.is_contiguous()
    assert h_n.dtype == dtype and h_n.shape == h0.shape and h_n.is_contiguous()
    leaves = [t.detach().double().requires_grad_() for t in (xp, h0, w)]
    y_ref = reference_forward(*leaves, lengths, nonlinearity)
    assert_close(y, y_ref, dtype, "y")
    grad_y = torch.randn_like(y_ref)
    grads = torch.autograd.grad(y, (xp, h0, w), grad_y.to(dtype))
    grads_ref = torch.autograd.grad(y_ref, leaves, grad_y)
    for name, g, g_ref in zip(("xp", "h0", "w_hh"), grads, grads_ref):
        assert g.dtype == dtype
        assert_close(g, g_ref, dtype, f"grad {name}")


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
@pytest.mark.parametrize("with_lengths", [False, True])
@pytest.mark.parametrize("T,B,H", [(1, 1, 1), (6, 3, 7), (5, 2, 33), (3, 4, 129), (1, 5, 8)])
def test_matches_reference(device, dtype, nonlinearity, with_lengths, T, B, H):
    xp, h0, w = make_op_inputs(T, B, H, dtype, device, requires_grad=True)
    lengths = random_lengths(T, B) if with_lengths else None
    check_against_reference(xp, h0, w, lengths, nonlinearity, dtype)


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_lengths", [False, True])
def test_reduced_precision(device, dtype, with_lengths):
    xp, h0, w = make_op_inputs(32, 4, 33, dtype, device, requires_grad=True)
    lengths = random_lengths(32, 4) if with_lengths else None
    check_against_reference(xp, h0, w, lengths, "tanh", dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_lengths", [False, True])
def test_reduced_precision_cpu_is_float32_rounded_once(dtype, with_lengths):
    """On the CPU, float16 and bfloat16 run the float32 loop on upcast inputs
    and round the results once: bit for bit the float32 op's results cast
    down. (The float64 bound of 1e-2 is sized for the GPU kernels, which
    round every step; it would not notice a CPU path rounding through the
    wrong 16-bit type.)"""
    xp, h0, w = make_op_inputs(17, 3, 33, dtype, "cpu")
    lengths = random_lengths(17, 3) if with_lengths else None
    wide = [t.float() for t in (xp, h0, w)]
    y, h_n = forward(xp, h0, w, lengths, "tanh")
    y_wide, h_n_wide = forward(*wide, lengths, "tanh")
    assert torch.equal(y, y_wide.to(dtype)) and torch.equal(h_n, h_n_wide.to(dtype))
    grad_y = torch.randn(17, 3, 33).to(dtype)
    grads = backward(grad_y, y, h0, w, lengths, "tanh")
    grads_wide = backward(grad_y.float(), y.float(), wide[1], wide[2], lengths, "tanh")
    for name, g, g_wide in zip(("xp", "h0", "w_hh"), grads, grads_wide):
        assert g.dtype == dtype and torch.equal(g, g_wide.to(dtype)), f"grad {name}"


@pytest.mark.parametrize("device", devices)
def test_strided_inputs(device):
    """Slices of larger buffers, transposed views, and an expanded grad_y."""
    T, B, H = 5, 3, 9
    xp_buf = torch.randn(B, T + 2, 2 * H, dtype=torch.float64, device=device)
    xp = xp_buf[:, 1 : T + 1, :H].transpose(0, 1)  # T x B x H, strides (2H, (T+2)2H, 1)
    h0 = torch.randn(2 * B, H + 3, dtype=torch.float64, device=device)[::2, 3:]
    w_buf = torch.randn(H, 2 * H, dtype=torch.float64, device=device) * H**-0.5
    w_t = w_buf[:, :H].t()  # last stride 2H
    w_rows = w_buf[:, H:]  # row stride 2H
    for w in (w_t, w_rows):
        args = [t.requires_grad_() for t in (xp.detach(), h0.detach(), w.detach())]
        assert not any(t.is_contiguous() for t in args)
        check_against_reference(*args, None, "tanh", torch.float64)
    # grad_y of y.sum() is a stride-0 expansion.
    xp, h0, w = make_op_inputs(T, B, H, device=device, requires_grad=True)
    grads = torch.autograd.grad(forward(xp, h0, w, None, "tanh")[0].sum(), (xp, h0, w))
    grads_ref = torch.autograd.grad(reference_forward(xp, h0, w).sum(), (xp, h0, w))
    for g, g_ref in zip(grads, grads_ref):
        assert_close(g, g_ref, torch.float64)


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("varies", ["none", "steps", "batch", "steps_batch"])
def test_stride_0_grad_y(device, varies):
    """An incoming gradient constant along H (stride 0 there) and varying
    along none, one or both outer dimensions: the backward's results are
    those of the same values made dense."""
    T, B, H = 5, 3, 9
    shape = (T if "steps" in varies else 1, B if "batch" in varies else 1, 1)
    grad_y = torch.randn(shape, dtype=torch.float64, device=device).expand(T, B, H)
    assert grad_y.stride(-1) == 0
    xp, h0, w = make_op_inputs(T, B, H, device=device)
    y = forward(xp, h0, w, None, "tanh")[0]
    got = backward(grad_y, y, h0, w, None, "tanh")
    want = backward(grad_y.contiguous(), y, h0, w, None, "tanh")
    for name, g, g_want in zip(("xp", "h0", "w_hh"), got, want):
        assert torch.equal(g, g_want), f"grad {name}"


def test_lengths_semantics():
    """Past its length a sequence's outputs and deltas are zero; length 0
    leaves h0 untouched and sends no gradient to it through the op."""
    xp, h0, w = make_op_inputs(4, 3, 5, requires_grad=True)
    lengths = torch.tensor([4, 2, 0])
    y, h_n = forward(xp, h0, w, lengths, "tanh")
    assert (y[2:, 1] == 0).all() and (y[:, 2] == 0).all() and (y[:2, 1] != 0).all()
    # h_n: the last valid step's state, h0 itself where there is none.
    assert torch.equal(h_n, torch.stack([y[3, 0], y[1, 1], h0[2]]))
    grad_xp, grad_h0, _ = torch.autograd.grad(y, (xp, h0, w), torch.ones_like(y))
    assert (grad_xp[2:, 1] == 0).all() and (grad_xp[:, 2] == 0).all()
    assert (grad_h0[2] == 0).all() and (grad_h0[:2] != 0).all()


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("with_lengths", [False, True])
def test_opcheck(device, with_lengths):
    lengths = random_lengths(4, 3) if with_lengths else None
    xp, h0, w = make_op_inputs(4, 3, 5, torch.float32, device, requires_grad=True)
    torch.library.opcheck(forward, (xp, h0, w, lengths, "relu"))
    y = forward(xp, h0, w, lengths, "relu")[0].detach()
    # Inputs without grad: prnn::backward is not differentiable (see test_double_backward).
    torch.library.opcheck(
        backward, (torch.randn_like(y), y, h0.detach(), w.detach(), lengths, "relu")
    )


@pytest.mark.parametrize("with_lengths", [False, True])
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_gradcheck(with_lengths, nonlinearity):
    xp, h0, w = make_op_inputs(4, 3, 5, requires_grad=True)
    lengths = torch.tensor([4, 1, 3]) if with_lengths else None
    assert torch.autograd.gradcheck(
        lambda *a: forward(*a, lengths, nonlinearity), (xp, h0, w)
    )


def check_grad_of_one_input(op, leaves, index, name, device):
    """Only leaves[index] requires grad: op's outputs are still recorded, and
    that input's gradient is the one computed with all inputs requiring grad."""
    gen = torch.Generator().manual_seed(3)
    weights = torch.randn(4, 3, 5, generator=gen, dtype=torch.float64).to(device)

    def loss(y, h_n):
        return (y * weights).sum() + (h_n * weights[0]).sum()

    everything = [t.clone().requires_grad_() for t in leaves]
    expected = torch.autograd.grad(loss(*op(*everything)), everything)[index]
    one = [t.clone().requires_grad_(i == index) for i, t in enumerate(leaves)]
    y, h_n = op(*one)
    assert y.requires_grad and h_n.requires_grad, f"only {name} requires grad, but the outputs were not recorded"
    (got,) = torch.autograd.grad(loss(y, h_n), one[index])
    assert_close(got, expected, torch.float64, f"grad {name}")


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("with_lengths", [False, True])
@pytest.mark.parametrize("which", ["xp", "h0", "w_hh"])
def test_grad_of_one_input(device, with_lengths, which):
    lengths = torch.tensor([4, 1, 3]) if with_lengths else None
    check_grad_of_one_input(
        lambda *a: forward(*a, lengths, "tanh"), make_op_inputs(4, 3, 5, device=device),
        ("xp", "h0", "w_hh").index(which), which, device,
    )


def test_lengths_changed_before_backward_raises():
    """lengths is saved for backward like the tensors: changing it in place
    in between is autograd's error, not a gradient for the wrong lengths."""
    xp, h0, w = make_op_inputs(4, 3, 5, requires_grad=True)
    lengths = torch.tensor([4, 2, 3])
    y, _ = forward(xp, h0, w, lengths, "tanh")
    lengths.fill_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(y.sum(), xp)


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("which", ["xp", "h0", "w_hh"])
@pytest.mark.parametrize("grad_mode", [True, False])
def test_forward_mode_ad_raises(device, which, grad_mode):
    """No jvp formula: a dual input (torch.autograd.forward_ad) is refused,
    with or without grad mode, instead of its tangent being dropped."""
    import torch.autograd.forward_ad as fwAD
    inputs = make_op_inputs(3, 2, 4, device=device)
    index = ("xp", "h0", "w_hh").index(which)
    with fwAD.dual_level(), torch.set_grad_enabled(grad_mode):
        inputs[index] = fwAD.make_dual(inputs[index], torch.randn_like(inputs[index]))
        with pytest.raises(RuntimeError, match="forward-mode AD .* is not supported"):
            forward(*inputs, None, "tanh")


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("transform", ["jvp", "jacfwd"])
def test_raw_op_under_func_forward_transforms_raises(device, transform):
    """torch.func's forward-mode transforms on the raw op: a clear error, not
    zero tangents (the module refuses all of torch.func's autodiff itself)."""
    xp, h0, w = make_op_inputs(3, 2, 4, device=device)
    f = lambda a: forward(a, h0, w, None, "tanh")[0]  # noqa: E731
    call = {
        "jvp": lambda: torch.func.jvp(f, (xp,), (torch.ones_like(xp),)),
        "jacfwd": lambda: torch.func.jacfwd(lambda a: f(a).sum())(xp),
    }[transform]
    with pytest.raises(RuntimeError, match="forward-mode AD .* is not supported"):
        call()


def test_double_backward_raises():
    xp, h0, w = make_op_inputs(3, 2, 4, requires_grad=True)
    (grad_xp,) = torch.autograd.grad(forward(xp, h0, w, None, "tanh")[0].sum(), xp, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward .* is not supported"):
        grad_xp.sum().backward()


@pytest.mark.parametrize("device", devices)
def test_empty(device):
    xp, h0, w = make_op_inputs(3, 2, 4, device=device, requires_grad=True)
    # T == 0: empty y, h_n = h0; the gradients of h0 and w_hh through y are zeros.
    y, h_n = forward(xp[:0], h0, w, None, "tanh")
    assert y.shape == (0, 2, 4) and torch.equal(h_n, h0)
    grads = torch.autograd.grad(y, (xp, h0, w), torch.ones_like(y))
    assert grads[0].shape == (3, 2, 4) and all((g == 0).all() for g in grads)
    # B == 0: empty y and grad_h0; a zero w_hh gradient.
    y, h_n = forward(xp[:, :0], h0[:0], w, torch.zeros(0, dtype=torch.long), "tanh")
    assert y.shape == (3, 0, 4) and h_n.shape == (0, 4)
    grad_w = torch.autograd.grad(y, w, torch.ones_like(y))[0]
    assert grad_w.shape == (4, 4) and (grad_w == 0).all()
    # H == 0: empty y; empty gradients of the right shapes.
    y, h_n = forward(xp[..., :0], h0[:, :0], w[:0, :0], None, "tanh")
    assert y.shape == (3, 2, 0) and h_n.shape == (2, 0)
    grads = torch.autograd.grad(y, (xp, h0, w), torch.ones_like(y))
    assert [tuple(g.shape) for g in grads] == [(3, 2, 4), (2, 4), (4, 4)]


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("sizes", [(0, 3, 2, 5), (4, 0, 2, 5), (4, 3, 0, 5), (4, 3, 2, 0)], ids=str)
def test_layer_empty(device, bias, sizes):
    """prnn::layer with T, B, I or H zero: an empty or zero result and
    gradients of every input's shape (zero wherever nothing flows)."""
    T, B, I, H = sizes
    inputs = [t.requires_grad_() if t is not None else None for t in make_layer_inputs(T, B, I, H, device=device, bias=bias)]
    y, h_n = layer(*inputs, None, "tanh")
    assert y.shape == (T, B, H) and h_n.shape == (B, H)
    present = [t for t in inputs if t is not None]
    grads = torch.autograd.grad((y, h_n), present, (torch.ones_like(y), torch.ones_like(h_n)), allow_unused=True)
    for t, g in zip(present, grads):
        assert g is None or g.shape == t.shape


def other_device(t):
    """`t` on the other of cpu and cuda."""
    return t.cpu() if t.is_cuda else t.cuda()


# (what to change in the good arguments, the expected error, its message)
BAD_FORWARD_ARGS = [
    ({"xp": lambda a: a[0]}, RuntimeError, r"prnn::forward: xp must be 3-D \[steps, batch, hidden\], got 2-D"),
    ({"h0": lambda a: a[0]}, RuntimeError, r"prnn::forward: h0 must be 2-D \[batch, hidden\], got 1-D"),
    ({"w_hh": lambda a: a[0]}, RuntimeError, r"prnn::forward: w_hh must be 2-D"),
    ({"h0": lambda a: a[:2]}, RuntimeError, r"prnn::forward: h0 must have shape \[batch=3, hidden=5\], got \[2, 5\]"),
    ({"w_hh": lambda a: a[:, :4]}, RuntimeError, r"prnn::forward: w_hh must have shape \[hidden=5, hidden=5\], got \[5, 4\]"),
    ({"xp": lambda a: a.long()}, RuntimeError, r"prnn::forward: xp must be float32, float64, float16 or bfloat16, got Long"),
    ({"h0": lambda a: a.double()}, RuntimeError, r"prnn::forward: h0 must have the dtype of xp \(Float\), got Double"),
    ({"w_hh": lambda a: a.half()}, RuntimeError, r"prnn::forward: w_hh must have the dtype of xp \(Float\), got Half"),
    # A CUDA argument sends a CPU call to the CUDA impl, which must notice the CPU ones.
    pytest.param({"h0": other_device}, RuntimeError, r"prnn::forward: h0 must be on the device of xp \((cpu|cuda:0)\), got (cuda:0|cpu)", marks=needs_cuda),
    pytest.param({"w_hh": other_device}, RuntimeError, r"prnn::forward: w_hh must be on the device of xp \((cpu|cuda:0)\), got (cuda:0|cpu)", marks=needs_cuda),
    ({"lengths": lambda a: torch.tensor([4, 5, 1])}, RuntimeError, r"prnn::forward: lengths must be in \[0, steps=4\], got values in \[1, 5\]"),
    ({"lengths": lambda a: torch.tensor([4, -1, 1])}, RuntimeError, r"prnn::forward: lengths must be in \[0, steps=4\], got values in \[-1, 4\]"),
    ({"lengths": lambda a: torch.tensor([4, 2, 1], dtype=torch.int32)}, RuntimeError, r"prnn::forward: lengths must be int64, got Int"),
    ({"lengths": lambda a: torch.tensor([4, 2])}, RuntimeError, r"prnn::forward: lengths must have shape \[batch=3\], got \[2\]"),
    pytest.param({"lengths": lambda a: torch.tensor([4, 2, 1], device="cuda")}, RuntimeError, r"prnn::forward: lengths must be a CPU tensor .*, got one on cuda:0", marks=needs_cuda),
    ({"nonlinearity": lambda a: "sigmoid"}, ValueError, r"prnn::forward: nonlinearity must be 'tanh' or 'relu', got 'sigmoid'"),
]


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("change,error,message", BAD_FORWARD_ARGS)
def test_bad_forward_args(device, change, error, message):
    good = dict(zip(("xp", "h0", "w_hh"), make_op_inputs(4, 3, 5, torch.float32, device)))
    good.update(lengths=torch.tensor([4, 2, 1]), nonlinearity="tanh")
    bad = {k: change[k](v) if k in change else v for k, v in good.items()}
    with pytest.raises(error, match=message):
        forward(*bad.values())
    y, _ = forward(*good.values())  # still works
    assert_close(y, reference_forward(*list(good.values())[:4]), torch.float32)
    if device == "cuda":
        torch.cuda.synchronize()  # an error the bad call left in the context surfaces here


BAD_BACKWARD_ARGS = [
    ({"grad_y": lambda a: a[..., :4]}, RuntimeError, r"prnn::backward: grad_y must have the shape of y \[4, 3, 5\], got \[4, 3, 4\]"),
    ({"grad_y": lambda a: a.double()}, RuntimeError, r"prnn::backward: grad_y must have the dtype of y \(Float\), got Double"),
    pytest.param({"grad_y": other_device}, RuntimeError, r"prnn::backward: grad_y must be on the device of y \((cpu|cuda:0)\), got (cuda:0|cpu)", marks=needs_cuda),
    ({"y": lambda a: a[0]}, RuntimeError, r"prnn::backward: y must be 3-D \[steps, batch, hidden\], got 2-D"),
    ({"y": lambda a: a.long()}, RuntimeError, r"prnn::backward: y must be float32, float64, float16 or bfloat16, got Long"),
    ({"h0": lambda a: a[:1]}, RuntimeError, r"prnn::backward: h0 must have shape \[batch=3, hidden=5\], got \[1, 5\]"),
    pytest.param({"h0": other_device}, RuntimeError, r"prnn::backward: h0 must be on the device of y \((cpu|cuda:0)\), got (cuda:0|cpu)", marks=needs_cuda),
    ({"w_hh": lambda a: a.half()}, RuntimeError, r"prnn::backward: w_hh must have the dtype of y \(Float\), got Half"),
    ({"lengths": lambda a: torch.tensor([4, 5, 1])}, RuntimeError, r"prnn::backward: lengths must be in \[0, steps=4\], got values in \[1, 5\]"),
    ({"lengths": lambda a: torch.tensor([-3, 2, 1])}, RuntimeError, r"prnn::backward: lengths must be in \[0, steps=4\], got values in \[-3, 2\]"),
    ({"lengths": lambda a: torch.tensor([4, 2, 1], dtype=torch.int32)}, RuntimeError, r"prnn::backward: lengths must be int64, got Int"),
    ({"lengths": lambda a: torch.tensor([[4, 2, 1]])}, RuntimeError, r"prnn::backward: lengths must have shape \[batch=3\], got \[1, 3\]"),
    pytest.param({"lengths": lambda a: torch.tensor([4, 2, 1], device="cuda")}, RuntimeError, r"prnn::backward: lengths must be a CPU tensor .*, got one on cuda:0", marks=needs_cuda),
    ({"nonlinearity": lambda a: "TANH"}, ValueError, r"prnn::backward: nonlinearity must be 'tanh' or 'relu', got 'TANH'"),
]


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("change,error,message", BAD_BACKWARD_ARGS)
def test_bad_backward_args(device, change, error, message):
    xp, h0, w = make_op_inputs(4, 3, 5, torch.float32, device)
    lengths = torch.tensor([4, 2, 1])
    y, _ = forward(xp, h0, w, lengths, "tanh")
    good = dict(grad_y=torch.randn_like(y), y=y, h0=h0, w_hh=w, lengths=lengths, nonlinearity="tanh")
    bad = {k: change[k](v) if k in change else v for k, v in good.items()}
    with pytest.raises(error, match=message):
        backward(*bad.values())
    grads = backward(*good.values())  # still works
    leaves = [t.double().requires_grad_() for t in (xp, h0, w)]
    expected = torch.autograd.grad(reference_forward(*leaves, lengths), leaves, good["grad_y"].double())
    for name, g, ref in zip(("grad_xp", "grad_h0", "grad_w_hh"), grads, expected):
        assert_close(g, ref, torch.float32, name)
    if device == "cuda":
        torch.cuda.synchronize()


LAYER_NAMES = ("x", "w_ih", "b_ih", "b_hh", "h0", "w_hh")


def make_layer_inputs(T, B, I, H, dtype=torch.float64, device="cpu", bias=True, batch_first_x=False):
    """x, w_ih, b_ih, b_hh, h0, w_hh (biases None without bias); x is a
    transposed [B,T,I] tensor with batch_first_x (non-contiguous)."""
    gen = torch.Generator().manual_seed(11)

    def uniform(*shape, scale):
        return ((torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1) * scale).to(device, dtype)

    x = uniform(B, T, I, scale=1.0).transpose(0, 1) if batch_first_x else uniform(T, B, I, scale=1.0)
    w_ih = uniform(H, I, scale=max(I, 1) ** -0.5)
    b_ih, b_hh = (uniform(H, scale=0.5), uniform(H, scale=0.5)) if bias else (None, None)
    return [x, w_ih, b_ih, b_hh, uniform(B, H, scale=0.5), uniform(H, H, scale=max(H, 1) ** -0.5)]


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("with_lengths", [False, True])
@pytest.mark.parametrize("T,B,I,H", [(1, 1, 1, 1), (5, 3, 4, 7), (6, 2, 9, 33)])
def test_layer_matches_reference(device, dtype, bias, with_lengths, T, B, I, H):
    """prnn::layer = the input projection then prnn::forward: values and the
    gradients of every input (a random loss of y) against float64, with a
    non-contiguous x."""
    inputs = make_layer_inputs(T, B, I, H, dtype, device, bias, batch_first_x=True)
    lengths = random_lengths(T, B) if with_lengths else None
    leaves = [t.requires_grad_() if t is not None else None for t in inputs]
    y, h_n = layer(*leaves, lengths, "tanh")
    assert y.dtype == dtype and y.shape == (T, B, H) and y.is_contiguous()
    assert h_n.dtype == dtype and h_n.shape == (B, H) and h_n.is_contiguous()
    ref_leaves = [t.detach().double().requires_grad_() if t is not None else None for t in inputs]
    y_ref = layer_reference(*ref_leaves, lengths, "tanh")
    assert_close(y, y_ref, dtype, "y")
    grad_y = torch.randn_like(y_ref)
    present = [i for i, t in enumerate(leaves) if t is not None]
    grads = torch.autograd.grad(y, [leaves[i] for i in present], grad_y.to(dtype))
    grads_ref = torch.autograd.grad(y_ref, [ref_leaves[i] for i in present], grad_y)
    for i, g, g_ref in zip(present, grads, grads_ref):
        assert g.dtype == dtype and g.shape == leaves[i].shape
        assert_close(g, g_ref, dtype, f"grad {LAYER_NAMES[i]}")


@pytest.mark.parametrize("with_lengths", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_gradcheck(with_lengths, bias):
    inputs = [t.requires_grad_() if t is not None else None for t in make_layer_inputs(4, 3, 2, 5, bias=bias)]
    lengths = torch.tensor([4, 1, 3]) if with_lengths else None
    assert torch.autograd.gradcheck(lambda *a: layer(*a, lengths, "relu"), inputs)


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("which", LAYER_NAMES)
def test_layer_grad_of_one_input(device, which):
    """The others' gradients are skipped (needs_input_grad): still the right one."""
    check_grad_of_one_input(
        lambda *a: layer(*a, None, "tanh"), make_layer_inputs(4, 3, 2, 5, device=device),
        LAYER_NAMES.index(which), which, device,
    )


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("with_lengths", [False, True])
def test_layer_opcheck(device, with_lengths):
    lengths = random_lengths(4, 3) if with_lengths else None
    inputs = [t.requires_grad_() for t in make_layer_inputs(4, 3, 2, 5, torch.float32, device)]
    torch.library.opcheck(layer, (*inputs, lengths, "tanh"))


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("which", ["x", "w_ih", "b_hh"])
def test_layer_forward_mode_ad_raises(device, which):
    import torch.autograd.forward_ad as fwAD
    inputs = make_layer_inputs(3, 2, 2, 4, device=device)
    index = LAYER_NAMES.index(which)
    with fwAD.dual_level():
        inputs[index] = fwAD.make_dual(inputs[index], torch.randn_like(inputs[index]))
        with pytest.raises(RuntimeError, match="prnn::layer: forward-mode AD .* is not supported"):
            layer(*inputs, None, "tanh")


BAD_LAYER_ARGS = [
    ({"x": lambda a: a[0]}, r"prnn::layer: x must be 3-D \[steps, batch, input\], got 2-D"),
    ({"w_ih": lambda a: a[0]}, r"prnn::layer: w_ih must be 2-D \[hidden, input\], got 1-D"),
    ({"w_ih": lambda a: a[:, :1]}, r"prnn::layer: w_ih must have shape \[hidden, input=2\], got \[5, 1\]"),
    ({"w_ih": lambda a: a.double()}, r"prnn::layer: w_ih must have the dtype of x \(Float\), got Double"),
    ({"b_hh": lambda a: None}, r"prnn::layer: b_ih and b_hh must both be tensors or both be None"),
    ({"b_ih": lambda a: a[:4]}, r"prnn::layer: b_ih must have shape \[hidden=5\], got \[4\]"),
    ({"b_hh": lambda a: a.half()}, r"prnn::layer: b_hh must have the dtype of x \(Float\), got Half"),
    ({"b_ih": lambda a: a.view(1, 5)}, r"prnn::layer: b_ih must be 1-D \[hidden\], got 2-D"),
    ({"w_hh": lambda a: a[:4, :4]}, r"prnn::forward: w_hh must have shape \[hidden=5, hidden=5\], got \[4, 4\]"),
    pytest.param({"w_ih": other_device}, r"prnn::layer: w_ih must be on the device of x \((cpu|cuda:0)\), got (cuda:0|cpu)", marks=needs_cuda),
    pytest.param({"b_ih": other_device}, r"prnn::layer: b_ih must be on the device of x \((cpu|cuda:0)\), got (cuda:0|cpu)", marks=needs_cuda),
]


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("change,message", BAD_LAYER_ARGS)
def test_bad_layer_args(device, change, message):
    good = dict(zip(LAYER_NAMES, make_layer_inputs(4, 3, 2, 5, torch.float32, device)))
    bad = {k: change[k](v) if k in change else v for k, v in good.items()}
    with pytest.raises(RuntimeError, match=message):
        layer(*bad.values(), None, "tanh")
    y, _ = layer(*good.values(), None, "tanh")  # still works
    expected = layer_reference(*[t.double() for t in good.values()], None, "tanh")
    assert_close(y, expected, torch.float32)
    if device == "cuda":
        torch.cuda.synchronize()


def test_plan_cpu():
    plan = torch_prnn.plan(33, batch=4, steps=10)
    assert plan == {
        "tier": "cpu_reference",
        "workspace_bytes": 2 * 4 * 33 * 4,  # state and matrix-vector product, float32
        "grid": 1,
        "block": 1,
        "rows_per_cta": 33,
        "smem_bytes": 0,
        "fused_input_projection": False,
        "module": "prnn",  # the hand-over is off in the tests (conftest; test_crossover.py)
    }
    # The CPU never fuses a layer's input projection into the recurrence.
    assert torch_prnn.plan(33, batch=4, steps=10, input_size=20) == plan
    # float16 / bfloat16 run in float32 on the CPU; float64 in float64.
    assert torch_prnn.plan(33, batch=4, dtype=torch.bfloat16, backward=True, lengths=True) == plan
    assert torch_prnn.plan(33, batch=4, dtype=torch.float64)["workspace_bytes"] == 2 * 4 * 33 * 8
    # Valid but beyond every tier: an answer, not an error.
    assert torch_prnn.plan(2**31)["tier"] == "none"


def test_plan_errors():
    with pytest.raises(ValueError, match="prnn::plan: nonlinearity must be 'tanh' or 'relu', got 'gelu'"):
        torch_prnn.plan(8, nonlinearity="gelu")
    with pytest.raises(RuntimeError, match="prnn::plan: dtype must be float32, float64, float16 or bfloat16, got Int"):
        torch_prnn.plan(8, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="prnn::plan: PRNN_STATUS_BAD_PARAM: hidden must be >= 1, got 0"):
        torch_prnn.plan(0)
    with pytest.raises(RuntimeError, match="prnn::plan: no plan for device meta: expected cpu or cuda"):
        torch_prnn.plan(8, device="meta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU-only build")
def test_no_cuda_build():
    with pytest.raises(RuntimeError, match="no plan for device cuda: torch_prnn was built without CUDA"):
        torch_prnn.plan(8, device="cuda")


@needs_cuda
def test_plan_cuda():
    plan = torch_prnn.plan(256, batch=4, steps=64, dtype=torch.bfloat16, device="cuda")
    assert plan["tier"] in ("persistent_registers", "persistent_shared", "persistent_cluster", "stepwise")
    assert plan["grid"] >= 1 and plan["block"] >= 1
    assert torch_prnn.plan(256, device=torch.device("cuda", 0)) == torch_prnn.plan(256, device="cuda")
