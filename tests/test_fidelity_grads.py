"""Gradients as nn.RNN hands them out, wherever a user can see them:
a tensor of its own for every parameter (in-place use of one gradient, as
clip_grad_norm_ and GradScaler.unscale_ do, must touch only that one);
output and h_n as independent autograd outputs (retain_grad, hooks and
torch.autograd.grad on one never see the other's gradient); relu's
derivative where the output is NaN; no NaN in W_hh's gradient from a state
past a sequence's end. Every case against nn.RNN in float64 on the same
weights, also in 16 bits (which the CPU computes in float32)."""

import copy
import itertools

import pytest
import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

from conftest import (TOL, assert_close, devices, make_op_inputs, reference_final_state, reference_forward, rel_err,
                      twins)

forward, layer = torch.ops.prnn.forward, torch.ops.prnn.layer

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
REDUCED = (torch.float16, torch.bfloat16)

# Module configurations: every op path (prnn::layer forward, F.linear and
# prnn::forward in reverse), with and without biases, one and several layers.
CONFIGS = {
    "forward": {},
    "bidirectional": {"bidirectional": True},
    "multi_layer": {"num_layers": 3},
    "multi_layer_bidirectional": {"num_layers": 2, "bidirectional": True},
    "no_bias_bidirectional": {"bias": False, "bidirectional": True},
    "relu_bidirectional": {"nonlinearity": "relu", "bidirectional": True},
}

# How the input is given: (batch_first, packed, unbatched).
LAYOUTS = {
    "time_major": (False, False, False),
    "batch_first": (True, False, False),
    "packed": (False, True, False),
    "unbatched": (False, False, True),
}

T, B, I = 5, 3, 4
LENGTHS = torch.tensor([3, 5, 2])  # unsorted: the packed path permutes the batch


def make_leaf(layout, dtype, device):
    """The tensor a user feeds (and reads the gradient of) in `layout`: the
    padded tensor for packed input."""
    batch_first, _, unbatched = LAYOUTS[layout]
    shape = (T, I) if unbatched else (B, T, I) if batch_first else (T, B, I)
    return torch.randn(shape, dtype=dtype, device=device, requires_grad=True)


def module_input(layout, leaf):
    """What the module gets: `leaf` itself, or packed."""
    return pack_padded_sequence(leaf, LENGTHS, enforce_sorted=False) if LAYOUTS[layout][1] else leaf


def reference_leaf(leaf):
    return leaf.detach().double().requires_grad_()


def data_of(output):
    return output.data if isinstance(output, PackedSequence) else output


LAYER_NAMES = ("x", "w_ih", "b_ih", "b_hh", "h0", "w_hh")


def make_layer_inputs(T, B, I, H, dtype, device):
    """x, w_ih, b_ih, b_hh, h0, w_hh of prnn::layer."""
    x = torch.randn(T, B, I, dtype=torch.float64)
    w_ih = torch.randn(H, I, dtype=torch.float64) * I**-0.5
    b_ih, b_hh = 0.5 * torch.randn(H, dtype=torch.float64), 0.5 * torch.randn(H, dtype=torch.float64)
    _, h0, w_hh = make_op_inputs(T, B, H)
    return [t.to(device, dtype) for t in (x, w_ih, b_ih, b_hh, h0, w_hh)]


# ---- 1. a gradient tensor of its own for every parameter


def random_loss(output, h_n):
    """A loss that weighs every element of output and h_n differently."""
    gen = torch.Generator().manual_seed(1)
    out = data_of(output)
    weights = [torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t) for t in (out, h_n)]
    return (out * weights[0]).sum() + (h_n * weights[1]).sum()


def torch_errors(reference, dtype, inputs, layout, ref_grads):
    """For the 16-bit dtypes, the relative error of each gradient of nn.RNN
    itself in `dtype` (the float64 reference's weights, rounded) against the
    float64 reference, so that a tolerance can follow torch's own rounding on
    this torch build: [None] * n for the wider dtypes."""
    if dtype not in REDUCED:
        return [None] * len(ref_grads)
    theirs = copy.deepcopy(reference).to(dtype)
    leaves = [t.detach().to(dtype).requires_grad_() for t in inputs]
    output, h_n = theirs(module_input(layout, leaves[0]), *leaves[1:])
    grads = torch.autograd.grad(random_loss(output, h_n), [*leaves, *theirs.parameters()])
    finite = [r.isfinite() for r in ref_grads]
    errors = [rel_err(g[f], r[f]) if f.any() and g[f].isfinite().all() else None
              for g, r, f in zip(grads, ref_grads, finite, strict=True)]
    # b_ih and b_hh add to the same pre-activation, so their gradients are one
    # quantity, which nn.RNN computes twice by different paths (two roundings)
    # and ours once: each bias takes the larger of torch's two errors.
    names = [None] * len(inputs) + [name for name, _ in theirs.named_parameters()]
    for i, name in enumerate(names):
        if name is not None and name.startswith("bias_ih_"):
            j = names.index("bias_hh_" + name[len("bias_ih_"):])
            pair = [e for e in (errors[i], errors[j]) if e is not None]
            if pair:
                errors[i] = errors[j] = max(pair)
    return errors


def assert_close_as_torch(out, ref, dtype, what, torch_error):
    """assert_close, with the 16-bit bound widened to twice nn.RNN's own error when that is larger."""
    bound = TOL[dtype] if torch_error is None else max(TOL[dtype], 2 * torch_error)
    err = rel_err(out, ref)
    assert err < bound, f"{what}: relative error {err:.3g} >= {bound:g} (torch's own {torch_error})"


def assert_distinct(tensors, names):
    """No two of `tensors` are one object or share memory."""
    for (a, name_a), (b, name_b) in itertools.combinations(zip(tensors, names, strict=True), 2):
        assert a is not b, f"the gradients of {name_a} and {name_b} are one tensor"
        assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr(), (
            f"the gradients of {name_a} and {name_b} share memory"
        )


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_parameter_grads_are_distinct_tensors(device, dtype, config, packed):
    """torch.autograd.grad and .backward() give every parameter (and the
    input and hx) a tensor of its own, with nn.RNN's values."""
    ours, reference = twins(device, dtype, **CONFIGS[config])
    layout = "packed" if packed else "time_major"
    leaf = make_leaf(layout, dtype, device)
    ref_leaf = reference_leaf(leaf)
    hx = 0.5 * torch.randn(ours.num_layers * (1 + ours.bidirectional), B, 7, dtype=dtype, device=device)
    hx.requires_grad_()
    ref_hx = hx.detach().double().requires_grad_()
    names = ["input", "hx"] + [n for n, _ in ours.named_parameters()]

    grads = torch.autograd.grad(random_loss(*ours(module_input(layout, leaf), hx)), [leaf, hx, *ours.parameters()])
    ref_output, ref_h_n = reference(module_input(layout, ref_leaf), ref_hx)
    ref_grads = torch.autograd.grad(random_loss(ref_output, ref_h_n), [ref_leaf, ref_hx, *reference.parameters()])
    assert_distinct(grads, names)
    errors = torch_errors(reference, dtype, [leaf, hx], layout, ref_grads)
    for name, g, r, e in zip(names, grads, ref_grads, errors, strict=True):
        assert g.dtype == dtype and g.shape == r.shape, name
        assert_close_as_torch(g, r, dtype, f"grad {name}", e)

    random_loss(*ours(module_input(layout, leaf), hx)).backward()
    assert_distinct([leaf.grad, hx.grad, *(p.grad for p in ours.parameters())], names)
    for name, p, r, e in zip(names[2:], ours.parameters(), ref_grads[2:], errors[2:], strict=True):
        assert_close_as_torch(p.grad, r, dtype, f".grad of {name}", e)


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", CONFIGS)
def test_clip_grad_norm_of_returned_grads(device, dtype, config):
    """Gradients from torch.autograd.grad set as .grad, then clipped in place
    and scaled in place (as GradScaler.unscale_ does): each parameter's
    gradient changes once, by the factor clipping chose, as with nn.RNN."""
    ours, reference = twins(device, dtype, **CONFIGS[config])
    x = torch.randn(T, B, I, dtype=dtype, device=device)
    for module, input in ((ours, x), (reference, x.double())):
        params = list(module.parameters())
        grads = torch.autograd.grad(random_loss(*module(input)), params)
        before = [g.clone() for g in grads]
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        total = torch.nn.utils.clip_grad_norm_(params, max_norm=1e-2)
        for g in grads:
            g.mul_(0.5)
        factor = 0.5 * 1e-2 / (total.double().item() + 1e-6)
        for (name, p), g in zip(module.named_parameters(), before, strict=True):
            assert_close(p.grad, g * factor, dtype, f"{type(module).__name__}: clipped and scaled grad {name}")
    if dtype not in REDUCED:  # 16 bits: the values against nn.RNN's in test_parameter_grads_are_distinct_tensors
        for (name, p), q in zip(ours.named_parameters(), reference.parameters(), strict=True):
            assert_close(p.grad, q.grad, dtype, f"clipped and scaled grad {name}, against nn.RNN")


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_lengths", [False, True])
def test_layer_op_bias_grads_are_distinct(device, dtype, with_lengths):
    """prnn::layer's own backward: a tensor for b_ih and another for b_hh,
    also when only one of them requires grad."""
    inputs = make_layer_inputs(T, B, I, 7, dtype, device)
    lengths = LENGTHS if with_lengths else None
    leaves = [t.clone().requires_grad_() for t in inputs]
    y, h_n = layer(*leaves, lengths, "tanh")
    grads = torch.autograd.grad(random_loss(y, h_n), leaves)
    assert_distinct(grads, LAYER_NAMES)
    assert torch.equal(grads[2], grads[3])  # the same values: xp has b_ih + b_hh
    for which in (2, 3):
        leaves = [t.clone().requires_grad_(i == which) for i, t in enumerate(inputs)]
        (g,) = torch.autograd.grad(random_loss(*layer(*leaves, lengths, "tanh")), leaves[which])
        assert torch.equal(g, grads[which]), LAYER_NAMES[which]


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("config", ["forward", "bidirectional"])
def test_compiled_module_grads(device, config, fresh_dynamo):
    """Under torch.compile(fullgraph=True), as in eager: a gradient tensor of
    its own for every parameter, output's and h_n's gradients apart, and
    nn.RNN's values."""
    ours, reference = twins(device, torch.float32, **CONFIGS[config])
    compiled = torch.compile(ours, fullgraph=True)
    x = torch.randn(T, B, I, device=device, requires_grad=True)
    x_ref = reference_leaf(x)
    names = ["input"] + [n for n, _ in ours.named_parameters()]
    output, h_n = compiled(x)
    grads = torch.autograd.grad(output.sum() + 10 * h_n.sum(), [x, *ours.parameters()])
    ref_output, ref_h_n = reference(x_ref)
    ref_grads = torch.autograd.grad(ref_output.sum() + 10 * ref_h_n.sum(), [x_ref, *reference.parameters()])
    assert_distinct(grads, names)
    for name, g, r in zip(names, grads, ref_grads, strict=True):
        assert_close(g, r, torch.float32, f"grad {name}")
    output, h_n = compiled(x)
    for t in (output, h_n):
        t.retain_grad()
    (output.sum() + 10 * h_n.sum()).backward()
    assert torch.equal(output.grad, torch.ones_like(output)) and torch.equal(h_n.grad, torch.full_like(h_n, 10))


# ---- 2. output and h_n: independent autograd outputs


def run_both(module, layout, leaf, hooks):
    """What a user sees of the gradients of loss = output.sum() + 10 h_n.sum()
    (stride-0 gradients, the most common kind), each from a forward of its
    own: torch.autograd.grad with respect to output (its data when packed)
    and to h_n; the gradients hooks on them receive, and the input's and every
    parameter's from torch.autograd.grad; retain_grad of output and h_n,
    and .grad after backward(). `hooks` (name -> function) are registered
    on "output" / "h_n" in every forward."""
    params = list(module.parameters())

    def run():
        output, h_n = module(module_input(layout, leaf))
        outputs = {"output": data_of(output), "h_n": h_n}
        for name, hook in hooks.items():
            outputs[name].register_hook(hook)
        return outputs, outputs["output"].sum() + 10 * outputs["h_n"].sum()

    # One output at a time: given both, torch's engine captures h_n's gradient
    # before h_n's hooks run (h_n, stacked from the layers' states, leads into
    # the node that makes output, which then runs; nn.RNN makes both in one node).
    outputs, loss = run()
    seen = {"by_grad": [torch.autograd.grad(loss, t, retain_graph=True)[0] for t in outputs.values()]}
    outputs, loss = run()
    for name, t in outputs.items():  # before `hooks`' own hooks: the gradient as it arrives
        t.register_hook(lambda g, name=name: seen.__setitem__(f"hooked {name}", g.clone()))
    seen["grads"] = torch.autograd.grad(loss, [leaf, *params])
    outputs, loss = run()
    for t in outputs.values():
        t.retain_grad()
    leaf.grad = None
    module.zero_grad(set_to_none=True)
    loss.backward()
    seen["retained"] = [t.grad for t in outputs.values()]
    seen["dot_grads"] = [leaf.grad, *(p.grad for p in params)]
    return outputs, seen


def check_both(ours, reference, layout, dtype, device, hooks=None):
    """run_both of `ours` against the float64 nn.RNN `reference`, on the same input."""
    hooks = hooks or {}
    leaf = make_leaf(layout, dtype, device)
    outputs, got = run_both(ours, layout, leaf, hooks)
    ref_outputs, ref = run_both(reference, layout, reference_leaf(leaf), hooks)
    for name in ("output", "h_n"):
        assert_close(outputs[name], ref_outputs[name], dtype, name)
    # The gradients of output and h_n come from the loss alone: exact.
    for kind in ("by_grad", "retained"):
        for name, g, r in zip(("output", "h_n"), got[kind], ref[kind], strict=True):
            assert g.dtype == dtype and torch.equal(g.double(), r), f"{kind} gradient of {name}"
    for name in ("output", "h_n"):
        key = f"hooked {name}"
        assert torch.equal(got[key].double(), ref[key]), f"{key}'s gradient"
    names = ["input"] + [n for n, _ in ours.named_parameters()]
    for kind in ("grads", "dot_grads"):
        for name, g, r in zip(names, got[kind], ref[kind], strict=True):
            assert g.dtype == dtype and g.shape == r.shape, name
            assert_close(g, r, dtype, f"{kind} {name}")


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", ["forward", "bidirectional", "multi_layer", "no_bias_bidirectional"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_output_grad_excludes_h_n_grad(device, dtype, config, layout):
    """With loss = output.sum() + 10 h_n.sum(), output's gradient is all ones
    and h_n's all tens wherever a user looks (nn.RNN's), and every parameter
    gets nn.RNN's gradient."""
    ours, reference = twins(device, dtype, **{**CONFIGS[config], "batch_first": LAYOUTS[layout][0]})
    check_both(ours, reference, layout, dtype, device)


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("config", ["forward", "bidirectional", "multi_layer"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("zeroed", ["output", "h_n"])
def test_hook_zeroing_one_output_grad(device, dtype, config, layout, zeroed):
    """A hook that zeroes the gradient of output (or of h_n) removes only that
    output's part of the parameters' gradients: the other's remains, as in nn.RNN."""
    ours, reference = twins(device, dtype, **{**CONFIGS[config], "batch_first": LAYOUTS[layout][0]})
    check_both(ours, reference, layout, dtype, device, hooks={zeroed: torch.zeros_like})
    assert reference.weight_hh_l0.grad.norm() > 0.1  # what the other output leaves


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_h_n_is_not_output_memory(device, config, layout):
    """h_n shares no memory with output: changing one in place leaves the
    other as it was (nn.RNN's h_n is a tensor of its own too)."""
    ours, _ = twins(device, torch.float64, **{**CONFIGS[config], "batch_first": LAYOUTS[layout][0]})
    with torch.no_grad():
        output, h_n = ours(module_input(layout, make_leaf(layout, torch.float64, device)))
        out = data_of(output)
        assert out.untyped_storage().data_ptr() != h_n.untyped_storage().data_ptr()
        before = out.clone()
        h_n.fill_(7.0)
        assert torch.equal(out, before), "changing h_n in place changed output"


OP_LENGTHS = {
    "none": None, "full": torch.tensor([5, 5, 5]), "mixed": torch.tensor([5, 2, 4]), "zero": torch.tensor([3, 0, 5]),
}
GRAD_OF = ["both", "y", "h_n", "sum"]


def check_final_state_op(op, inputs, lengths, dtype, grad_of, reference):
    """(y, h_n) of `op` and the gradients of a loss on y, h_n or both against
    autograd through `reference` (float64 leaves -> y)."""
    y, h_n = op(*inputs, lengths, "tanh")
    h0 = inputs[-2]
    assert h_n.shape == h0.shape and h_n.dtype == dtype and h_n.is_contiguous()
    for other, name in ((y, "y"), (h0, "h0")):
        if h_n.numel() and other.numel():
            assert h_n.untyped_storage().data_ptr() != other.untyped_storage().data_ptr(), f"h_n shares {name}'s memory"
    assert torch.equal(h_n, reference_final_state(y, h0, lengths))  # a copy of the op's own y (or h0)
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    y_ref = reference(*leaves)
    h_ref = reference_final_state(y_ref, leaves[-2], lengths)
    gen = torch.Generator().manual_seed(2)
    g_y, g_h = (torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.device) for t in (y_ref, h_ref))
    if grad_of == "both":
        grads = torch.autograd.grad((y, h_n), inputs, (g_y.to(y), g_h.to(y)))
        ref_grads = torch.autograd.grad((y_ref, h_ref), leaves, (g_y, g_h))
    elif grad_of == "y":
        grads = torch.autograd.grad(y, inputs, g_y.to(y))
        ref_grads = torch.autograd.grad(y_ref, leaves, g_y)
    elif grad_of == "h_n":
        grads = torch.autograd.grad(h_n, inputs, g_h.to(y))
        ref_grads = torch.autograd.grad(h_ref, leaves, g_h, allow_unused=True)
    else:  # stride-0 gradients of both
        grads = torch.autograd.grad(y.sum() + 3 * h_n.sum(), inputs)
        ref_grads = torch.autograd.grad(y_ref.sum() + 3 * h_ref.sum(), leaves)
    for i, (g, r) in enumerate(zip(grads, ref_grads, strict=True)):
        r = torch.zeros_like(leaves[i]) if r is None else r
        assert g.dtype == dtype and g.shape == r.shape
        assert_close(g, r, dtype, f"grad of input {i} ({grad_of})")


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lengths", OP_LENGTHS)
@pytest.mark.parametrize("grad_of", GRAD_OF)
def test_forward_op_final_state(device, dtype, lengths, grad_of):
    """prnn::forward returns (y, h_n): h_n a fresh [B, H] tensor, and its
    gradient reaches xp, h0 and w_hh as if it were read off y."""
    inputs = [t.requires_grad_() for t in make_op_inputs(T, B, 7, dtype, device)]
    lengths = OP_LENGTHS[lengths]
    act_grad_from = forward(*inputs, lengths, "tanh")[0] if dtype in REDUCED else None
    reference = lambda xp, h0, w: reference_forward(xp, h0, w, lengths, "tanh", act_grad_from)  # noqa: E731
    check_final_state_op(forward, inputs, lengths, dtype, grad_of, reference)


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lengths", OP_LENGTHS)
@pytest.mark.parametrize("grad_of", GRAD_OF)
def test_layer_op_final_state(device, dtype, lengths, grad_of):
    """prnn::layer returns (y, h_n) like prnn::forward."""
    inputs = [t.requires_grad_() for t in make_layer_inputs(T, B, I, 7, dtype, device)]
    lengths = OP_LENGTHS[lengths]
    act_grad_from = layer(*inputs, lengths, "tanh")[0] if dtype in REDUCED else None

    def reference(x, w_ih, b_ih, b_hh, h0, w_hh):
        return reference_forward(x @ w_ih.t() + b_ih + b_hh, h0, w_hh, lengths, "tanh", act_grad_from)

    check_final_state_op(layer, inputs, lengths, dtype, grad_of, reference)


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("op", ["forward", "layer"])
def test_op_final_state_without_steps(device, op):
    """T = 0: h_n is a copy of h0, and its gradient h0's."""
    if op == "forward":
        inputs = [t.requires_grad_() for t in make_op_inputs(0, B, 7, torch.float64, device)]
        y, h_n = forward(*inputs, None, "tanh")
    else:
        inputs = [t.requires_grad_() for t in make_layer_inputs(0, B, I, 7, torch.float64, device)]
        y, h_n = layer(*inputs, None, "tanh")
    h0 = inputs[-2]
    assert y.shape == (0, B, 7) and torch.equal(h_n, h0) and h_n.data_ptr() != h0.data_ptr()
    g = torch.randn_like(h_n)
    grads = torch.autograd.grad(h_n, inputs, g)
    for t, grad in zip(inputs, grads, strict=True):
        assert torch.equal(grad, g if t is h0 else torch.zeros_like(t))


# ---- 3. relu's derivative where the output is NaN


def assert_close_non_finite(out, ref, dtype, what, torch_error=None):
    """NaN and infinities exactly where `ref` has them, and close elsewhere
    (within twice torch_error, nn.RNN's own, where that is larger)."""
    out, ref = out.double(), ref.double().to(out.device)
    for kind in ("isnan", "isposinf", "isneginf"):
        got, expected = getattr(out, kind)(), getattr(ref, kind)()
        assert torch.equal(got, expected), (
            f"{what}: {kind} at {got.nonzero().tolist()}, expected at {expected.nonzero().tolist()}"
        )
    finite = ref.isfinite()
    if finite.any():
        assert_close_as_torch(out[finite], ref[finite], dtype, what, torch_error)


def check_non_finite_input(device, dtype, config, layout, nonlinearity, step, sequence, value):
    """Every output and gradient with input[step, sequence, 1] = value, against nn.RNN."""
    ours, reference = twins(device, dtype, **{**CONFIGS[config], "nonlinearity": nonlinearity, "hidden_size": 3})
    leaf = make_leaf(layout, dtype, device)
    with torch.no_grad():
        leaf[step, sequence, 1] = value
    ref_leaf = reference_leaf(leaf)
    names = ["input"] + [n for n, _ in ours.named_parameters()]
    output, h_n = ours(module_input(layout, leaf))
    grads = torch.autograd.grad(random_loss(output, h_n), [leaf, *ours.parameters()])
    ref_output, ref_h_n = reference(module_input(layout, ref_leaf))
    ref_grads = torch.autograd.grad(random_loss(ref_output, ref_h_n), [ref_leaf, *reference.parameters()])
    assert_close_non_finite(data_of(output), data_of(ref_output), dtype, "output")
    assert_close_non_finite(h_n, ref_h_n, dtype, "h_n")
    assert any(g.isfinite().any() and not g.isfinite().all() for g in ref_grads), "the case shows nothing"
    errors = torch_errors(reference, dtype, [leaf], layout, ref_grads)
    for name, g, r, e in zip(names, grads, ref_grads, errors, strict=True):
        assert_close_non_finite(g, r, dtype, f"grad {name}", e)


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", ["forward", "bidirectional", "multi_layer"])
@pytest.mark.parametrize("layout", ["time_major", "packed"])
def test_relu_nan_input_grads_match_nn_rnn(device, dtype, config, layout):
    """One NaN in the input of the full-length sequence: relu's derivative
    there is 1 (torch's: the gradient passes wherever the output is not
    <= 0), so every gradient is NaN exactly where nn.RNN's is and equal
    elsewhere."""
    check_non_finite_input(device, dtype, config, layout, "relu", step=2, sequence=1, value=float("nan"))


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_lengths", [False, True])
def test_relu_nan_op_backward(device, dtype, with_lengths):
    """prnn::backward with NaN in y (the forward of a NaN in xp): the
    gradient passes through the NaN elements, as torch.relu's does."""
    xp, h0, w = make_op_inputs(T, B, 7, dtype, device)
    xp[3, 1, 2] = float("nan")  # sequence 1, step 3: NaN at (3, 1, 2), then all of (4, 1)
    lengths = torch.tensor([5, 5, 2]) if with_lengths else None
    leaves = [t.requires_grad_() for t in (xp, h0, w)]
    y, _ = forward(*leaves, lengths, "relu")
    assert y[3, 1].isnan().sum() == 1 and y[4, 1].isnan().all()
    ref_leaves = [t.detach().double().requires_grad_() for t in (xp, h0, w)]
    y_ref = reference_forward(*ref_leaves, lengths, "relu", act_grad_from=y if dtype in REDUCED else None)
    g = torch.randn(y.shape, dtype=torch.float64, device=y.device)
    grads = torch.autograd.grad(y, leaves, g.to(y))
    ref_grads = torch.autograd.grad(y_ref, ref_leaves, g)
    assert_close_non_finite(y, y_ref, dtype, "y")
    assert ref_grads[0][3, 1, 2].isfinite() and ref_grads[0][3, 1, 2] != 0  # passed through the NaN
    for name, got, ref in zip(("xp", "h0", "w_hh"), grads, ref_grads, strict=True):
        assert_close_non_finite(got, ref, dtype, f"grad {name}")


# ---- 4. NaN or infinity at the end of a short sequence


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", ["forward", "bidirectional", "multi_layer_bidirectional"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_end_of_a_short_sequence(device, dtype, config, value):
    """NaN or inf in the input at the last step of a sequence shorter than
    the longest (packed, relu: the state it ends with is NaN or inf, its
    deltas finite): nn.RNN never multiplies that state by W_hh again, so
    the gradient of W_hh keeps its finite elements, here too."""
    check_non_finite_input(device, dtype, config, "packed", "relu", step=2, sequence=0, value=value)


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_op_weight_grad_stops_at_lengths(device, dtype):
    """prnn::backward's grad_w_hh sums delta_t^T s_{t-1} over each sequence's
    steps only: the state a sequence ends with (inf here) or the h0 of one of
    length 0 (NaN) never meets the zero deltas past its length."""
    xp, h0, w = make_op_inputs(T, B, 7, dtype, device)
    lengths = torch.tensor([5, 2, 0])
    y, _ = forward(xp, h0, w, lengths, "relu")
    y[1, 1, 3], h0[2, 0] = float("inf"), float("nan")
    grad_xp, _, grad_w = torch.ops.prnn.backward(torch.randn_like(y), y, h0, w, lengths, "relu")
    prev = torch.cat([h0.unsqueeze(0), y[:-1]]).double()
    within = (torch.arange(T).unsqueeze(1) < lengths).to(device)  # T x B
    expected = grad_xp.double()[within].t() @ prev[within]  # rows: the (step, sequence) pairs within
    assert grad_w.isfinite().all()
    assert_close(grad_w, expected, dtype, "grad_w_hh")
