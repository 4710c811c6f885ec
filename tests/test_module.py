"""PersistentRNN against torch.nn.RNN with the same weights: outputs, h_n and
every gradient, for each constructor option, odd sizes, layouts, unbatched
and packed input, dropout; the nn.RNN interface and its errors."""

import copy
import itertools
import re
import warnings

import pytest
import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

import torch_prnn
from conftest import TOL, assert_close, devices, needs_cuda, rel_err, twins

TESTED_DTYPES = [torch.float64, torch.float32]


def run(module, input, hx):
    """Output, h_n, and the gradients of a random loss of both with respect to
    input, hx and every parameter."""
    output, h_n = module(input, hx)
    data = output.data if isinstance(output, PackedSequence) else output
    gen = torch.Generator().manual_seed(1)
    loss = (data * torch.randn(data.shape, generator=gen).to(data)).sum() + (
        h_n * torch.randn(h_n.shape, generator=gen).to(h_n)
    ).sum()
    leaves = [hx] if hx is not None else []
    leaves += [input.data if isinstance(input, PackedSequence) else input]
    grads = torch.autograd.grad(loss, leaves + list(module.parameters()))
    return output, h_n, grads


def as_reference(x, dtype=torch.float64):
    """A float64 (or `dtype`) leaf copy of a tensor or of a PackedSequence's data."""
    if isinstance(x, PackedSequence):
        return PackedSequence(as_reference(x.data, dtype), x.batch_sizes, x.sorted_indices, x.unsorted_indices)
    # A fresh contiguous copy: nn.RNN on cuDNN refuses a strided hx (and
    # float64 input would otherwise share a misaligned or strided storage).
    if x is None:
        return None
    return x.detach().to(dtype, memory_format=torch.contiguous_format, copy=True).requires_grad_()


def nudged(x, dtype):
    """as_reference(x, dtype) with each element moved one step of dtype up or
    down at random: the same problem as far as dtype can tell, so that nn's
    computation on it is a second draw of the rounding dtype meets."""
    if isinstance(x, PackedSequence):
        return PackedSequence(nudged(x.data, dtype), x.batch_sizes, x.sorted_indices, x.unsorted_indices)
    if x is None:
        return None
    x = as_reference(x, dtype).detach()
    up = torch.rand(x.shape, generator=torch.Generator().manual_seed(2)).to(x.device) < 0.5
    return torch.where(up, x.nextafter(torch.full_like(x, float("inf"))),
                       x.nextafter(torch.full_like(x, float("-inf")))).requires_grad_()


def check_parity(ours, reference, input, hx, dtype, torch_factor=None, magnitudes=None):
    """`ours` (of `dtype`) against the float64 nn.RNN `reference`. With
    torch_factor, each bound is the larger of TOL and torch_factor times
    nn.RNN's own error in `dtype` (the reference narrowed: our weights
    exactly), so that a draw where rounding moves a pre-activation across
    relu's kink, for nn too, fails neither; nn's error is the larger of two
    draws, on the inputs and on them moved by a step of dtype each (nudged),
    since one draw of an error the recurrence amplifies (a single element at
    H = 1) may be lucky. magnitudes: {parameter name:
    the sum of its gradient's terms' magnitudes}; a parameter's gradient may
    then also be off by TOL of that (its terms summed in any order), which
    a gradient whose terms cancel needs: its error relative to its own norm
    is that of rounding, amplified, whichever the order, and one draw of
    nn's order may be lucky."""
    out1, h1, g1 = run(ours, input, hx)
    out2, h2, g2 = run(reference, as_reference(input), as_reference(hx))
    if isinstance(out2, PackedSequence):
        for field in ("batch_sizes", "sorted_indices", "unsorted_indices"):
            a, b = getattr(out1, field), getattr(out2, field)
            assert (a is None and b is None) or torch.equal(a, b), field
    values, expected = [out1, h1, *g1], [out2, h2, *g2]
    own = None
    if torch_factor is not None:
        twin = copy.deepcopy(reference).to(dtype)
        out3, h3, g3 = run(twin, as_reference(input, dtype), as_reference(hx, dtype))
        out4, h4, g4 = run(twin, nudged(input, dtype), nudged(hx, dtype))
        own = [(out3, out4), (h3, h4), *zip(g3, g4)]
    names = ["output", "h_n"] + [f"grad {n}" for n in (["hx"] if hx is not None else []) + ["input"]]
    parameters = [n for n, _ in ours.named_parameters()]
    names += [f"grad {n}" for n in parameters]
    magnitude_of = {f"grad {n}": magnitudes[n] for n in parameters} if magnitudes is not None else {}
    for i, (name, got, want) in enumerate(zip(names, values, expected, strict=True)):
        got, want = (got.data, want.data) if isinstance(got, PackedSequence) else (got, want)
        assert got.shape == want.shape and got.dtype == dtype, name
        bound = TOL[dtype]
        if own is not None:
            for mine in own[i]:
                mine = mine.data if isinstance(mine, PackedSequence) else mine
                bound = max(bound, torch_factor * rel_err(mine, want))
        if name in magnitude_of:
            bound = max(bound, TOL[dtype] * (magnitude_of[name].norm() / want.norm().clamp_min(1e-300)).item())
        err = rel_err(got, want)
        assert err < bound, f"{name}: relative error {err:.3g} >= {bound:.3g}"

def make_input(T, B, I, batch_first, dtype, device):
    shape = (B, T, I) if batch_first else (T, B, I)
    return torch.randn(shape, dtype=dtype, device=device, requires_grad=True)


OPTIONS = list(itertools.product([1, 3], [True, False], [False, True], [False, True], ["tanh", "relu"]))


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", TESTED_DTYPES, ids=str)
@pytest.mark.parametrize("num_layers,bias,batch_first,bidirectional,nonlinearity", OPTIONS)
def test_options(device, dtype, num_layers, bias, batch_first, bidirectional, nonlinearity):
    ours, reference = twins(
        device, dtype, num_layers=num_layers, bias=bias, batch_first=batch_first,
        bidirectional=bidirectional, nonlinearity=nonlinearity,
    )
    D = 2 if bidirectional else 1
    x = make_input(6, 3, 4, batch_first, dtype, device)
    hx = torch.randn(num_layers * D, 3, 7, dtype=dtype, device=device, requires_grad=True)
    check_parity(ours, reference, x, hx, dtype)
    check_parity(ours, reference, x, None, dtype)


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", TESTED_DTYPES, ids=str)
@pytest.mark.parametrize("T,B,H", [(1, 1, 1), (5, 2, 7), (4, 3, 33), (3, 2, 129), (1, 4, 33), (7, 1, 7)])
def test_sizes(device, dtype, T, B, H):
    ours, reference = twins(device, dtype, input_size=5, hidden_size=H, num_layers=2, bidirectional=True)
    check_parity(ours, reference, make_input(T, B, 5, False, dtype, device), None, dtype)


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_reduced_precision(device, dtype):
    ours, reference = twins(device, dtype, input_size=8, hidden_size=33, num_layers=2, bidirectional=True)
    check_parity(ours, reference, make_input(32, 4, 8, False, dtype, device), None, dtype)


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("batch_first", [False, True])
def test_non_contiguous(device, batch_first):
    dtype = torch.float64
    ours, reference = twins(device, dtype, num_layers=2, batch_first=batch_first, bidirectional=True)
    T, B = 5, 3
    # A slice of a larger buffer, and a view with batch and time swapped.
    buffer = torch.randn(T + 3, 2 * B, 11, dtype=dtype, device=device)
    sliced = buffer[2 : T + 2, ::2, 3:7]
    swapped = torch.randn(B, T, 4, dtype=dtype, device=device).transpose(0, 1)
    hx = torch.randn(B, 4, 2 * 7, dtype=dtype, device=device)[:, :, ::2].transpose(0, 1)
    if batch_first:  # B x T x 4: the same slice, and time-major memory
        sliced = sliced.transpose(0, 1)
        swapped = torch.randn(T, B, 4, dtype=dtype, device=device).transpose(0, 1)
    for x in (sliced, swapped):
        x = x.detach().requires_grad_()
        h = hx.detach().requires_grad_()
        assert not x.is_contiguous() and not h.is_contiguous()
        check_parity(ours, reference, x, h, dtype)


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("batch_first", [False, True])
def test_unbatched(device, batch_first):
    dtype = torch.float64
    ours, reference = twins(device, dtype, num_layers=2, batch_first=batch_first, bidirectional=True)
    x = torch.randn(5, 4, dtype=dtype, device=device, requires_grad=True)
    hx = torch.randn(4, 7, dtype=dtype, device=device, requires_grad=True)
    check_parity(ours, reference, x, hx, dtype)
    output, h_n = ours(x)
    assert output.shape == (5, 14) and h_n.shape == (4, 7)


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", TESTED_DTYPES, ids=str)
@pytest.mark.parametrize("enforce_sorted", [True, False])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_packed(device, dtype, enforce_sorted, bidirectional):
    ours, reference = twins(device, dtype, num_layers=2, bidirectional=bidirectional)
    lengths = torch.tensor([6, 4, 4, 1]) if enforce_sorted else torch.tensor([3, 6, 1, 4])
    x = torch.randn(6, 4, 4, dtype=dtype, device=device, requires_grad=True)
    hx = torch.randn(2 * (1 + bidirectional), 4, 7, dtype=dtype, device=device, requires_grad=True)
    packed = pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
    check_parity(ours, reference, packed, hx, dtype)
    check_parity(ours, reference, packed, None, dtype)
    # Round trip as users write it: padded output in the original batch order.
    padded, out_lengths = pad_packed_sequence(ours(packed)[0])
    assert torch.equal(out_lengths, lengths) and padded.shape == (6, 4, 7 * (1 + bidirectional))


@pytest.mark.parametrize("device", devices)
def test_dropout_eval_is_exact(device):
    """In eval mode dropout is off: the same as nn.RNN without dropout (in
    training mode, as cuDNN's RNN backward requires)."""
    ours, reference = twins(device, torch.float64, num_layers=3, dropout=0.5, bidirectional=True)
    ours.eval()
    reference.dropout = 0.0
    x = make_input(5, 3, 4, False, torch.float64, device)
    check_parity(ours, reference, x, None, torch.float64)


@pytest.mark.parametrize("device", devices)
def test_dropout_train(device):
    """Layer 1 is set to relu(I @ x) so its output shows the dropout applied to
    layer 0's (positive) output: each element is either zeroed or scaled by
    1/(1-p); about p of them are zeroed; the last layer's output is not dropped."""
    p, H, T, B = 0.5, 64, 20, 8
    rnn = torch_prnn.PersistentRNN(3, H, num_layers=2, nonlinearity="relu", dropout=p, device=device)
    with torch.no_grad():
        for name, param in rnn.named_parameters():
            param.uniform_(0.1, 1.0) if name.endswith("l0") else param.zero_()
        rnn.weight_hh_l0.mul_(0.5 / H)  # row sums < 1: a bounded positive recurrence
        rnn.weight_ih_l1.copy_(torch.eye(H))
    x = torch.rand(T, B, 3, device=device)
    expected = rnn.eval()(x)[0]  # = layer 0's output, all positive
    assert (expected > 0).all()
    output = rnn.train()(x)[0]
    zeroed = output == 0
    assert torch.allclose(output[~zeroed], expected[~zeroed] / (1 - p), rtol=1e-5)
    # T*B*H = 10240 Bernoulli(0.5) draws: the fraction's standard deviation is 0.005.
    assert abs(zeroed.double().mean().item() - p) < 0.05
    assert not torch.equal(rnn(x)[0], output)  # a fresh mask per call


@pytest.mark.parametrize("device", devices)
def test_zero_batch(device):
    ours, reference = twins(device, torch.float64, num_layers=2, bidirectional=True)
    x = torch.randn(5, 0, 4, dtype=torch.float64, device=device, requires_grad=True)
    (o1, h1), (o2, h2) = ours(x), reference(x)
    assert o1.shape == o2.shape == (5, 0, 14) and h1.shape == h2.shape == (4, 0, 7)
    grads = torch.autograd.grad(o1.sum() + h1.sum(), [x] + list(ours.parameters()))
    assert grads[0].shape == x.shape and all((g == 0).all() for g in grads[1:])


def test_autocast_cpu():
    ours, reference = twins("cpu", torch.float32, num_layers=2)
    theirs = copy.deepcopy(reference).float()
    x = torch.randn(6, 3, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (o1, h1), (o2, h2) = ours(x), theirs(x)
    assert o1.dtype == o2.dtype == torch.bfloat16 and h1.dtype == h2.dtype == torch.bfloat16
    ref_out, ref_h = reference(x.double())
    assert_close(o1, ref_out, torch.bfloat16, "output")
    assert_close(h1, ref_h, torch.bfloat16, "h_n")


def test_autocast_leaves_float64_alone():
    """Autocast's rule: float64 is not cast. A float64 module under
    autocast(bfloat16) runs in float64 with float64 numbers, as nn.RNN does."""
    ours, reference = twins("cpu", torch.float64, num_layers=2)
    x = torch.randn(6, 3, 4, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (o1, h1), (o2, h2) = ours(x), reference(x)
    assert o1.dtype == o2.dtype == torch.float64 and h1.dtype == h2.dtype == torch.float64
    assert_close(o1, o2, torch.float64, "output")
    assert_close(h1, h2, torch.float64, "h_n")


# ---- the nn.RNN interface -------------------------------------------------


def test_same_parameters_and_init_as_nn_rnn():
    kwargs = dict(input_size=3, hidden_size=5, num_layers=2, bidirectional=True)
    torch.manual_seed(7)
    ours = torch_prnn.PersistentRNN(**kwargs)
    torch.manual_seed(7)
    theirs = torch.nn.RNN(**kwargs)
    names = [n for n, _ in theirs.named_parameters()]
    assert [n for n, _ in ours.named_parameters()] == names
    for (_, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert torch.equal(a, b)
    theirs.load_state_dict(ours.state_dict())
    ours.load_state_dict(theirs.state_dict())
    assert [[p.shape for p in ps] for ps in ours.all_weights] == [
        [p.shape for p in ps] for ps in theirs.all_weights
    ]


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        dict(num_layers=2, nonlinearity="relu", bias=False, batch_first=True, dropout=0.25, bidirectional=True),
    ],
)
def test_repr_and_from_rnn(kwargs):
    theirs = torch.nn.RNN(3, 5, **kwargs).double().eval()
    ours = torch_prnn.PersistentRNN.from_rnn(theirs)
    assert repr(ours) == repr(theirs).replace("RNN(", "PersistentRNN(", 1)
    assert ours.nonlinearity == theirs.nonlinearity and not ours.training
    assert ours.weight_hh_l0.dtype == torch.float64
    x = torch.randn(4, 2, 3, dtype=torch.float64)
    assert_close(ours(x)[0], theirs(x)[0], torch.float64)
    ours.flatten_parameters()  # accepted, like nn.RNN's
    with pytest.raises(TypeError, match="from_rnn expects a torch.nn.RNN, got LSTM"):
        torch_prnn.PersistentRNN.from_rnn(torch.nn.LSTM(3, 5))


@pytest.mark.parametrize(
    "args,kwargs",
    [
        ((3, 5), dict(nonlinearity="sigmoid")),
        ((3, 5), dict(dropout=1.5)),
        ((3, 5), dict(dropout=True)),
        ((3, 5), dict(bias=1)),
        ((3, 5), dict(batch_first="yes")),
        ((3.0, 5), {}),
        ((0, 5), {}),
        ((3, 5.0), {}),
        ((3, 0), {}),
        ((3, 5, 0), {}),
    ],
)
def test_constructor_errors_match_nn_rnn(args, kwargs):
    with pytest.raises(Exception) as theirs:
        torch.nn.RNN(*args, **kwargs)
    with pytest.raises(type(theirs.value), match=f"^{re.escape(str(theirs.value))}$"):
        torch_prnn.PersistentRNN(*args, **kwargs)


def test_dropout_warning_matches_nn_rnn():
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        torch_prnn.PersistentRNN(3, 5, dropout=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch_prnn.PersistentRNN(3, 5, num_layers=2, dropout=0.5)


BAD_CALLS = [
    ("wrong dtype", lambda: (torch.randn(5, 3, 4, dtype=torch.float64), None)),
    ("wrong rank", lambda: (torch.randn(5, 3, 4, 1), None)),
    ("wrong input_size", lambda: (torch.randn(5, 3, 6), None)),
    ("hx shape", lambda: (torch.randn(5, 3, 4), torch.randn(4, 2, 7))),
    ("hx rank, batched", lambda: (torch.randn(5, 3, 4), torch.randn(4, 7))),
    ("hx rank, unbatched", lambda: (torch.randn(5, 4), torch.randn(4, 1, 7))),
    ("empty sequence", lambda: (torch.randn(0, 3, 4), None)),
    ("empty unbatched sequence", lambda: (torch.randn(0, 4), None)),
]


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("name,make", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_calls_match_nn_rnn(device, name, make):
    ours, reference = twins(device, torch.float32, num_layers=2, bidirectional=True)
    theirs = copy.deepcopy(reference).float()  # the same dtype: it is in one of the messages
    input, hx = (None if t is None else t.to(device) for t in make())
    with pytest.raises(Exception) as expected:
        theirs(input, hx)
    with pytest.raises(type(expected.value), match=f"^{re.escape(str(expected.value))}$"):
        ours(input, hx)
    x = torch.randn(5, 3, 4, device=device)
    # Still works (against the float64 twin: cuDNN's float32 RNN uses TF32).
    assert_close(ours(x)[0], reference(x.double())[0], torch.float32)
    if device == "cuda":
        torch.cuda.synchronize()


@pytest.mark.parametrize("device", devices)
def test_mismatched_hx(device):
    ours, reference = twins(device, torch.float32)
    x = torch.randn(5, 3, 4, device=device)
    with pytest.raises(RuntimeError, match=r"prnn::forward: h0 must have the dtype of xp \(Float\), got Double"):
        ours(x, torch.zeros(1, 3, 7, dtype=torch.float64, device=device))
    hx = torch.randn(1, 3, 7, device=device)
    assert_close(ours(x, hx)[0], reference(x.double(), hx.double())[0], torch.float32)


@pytest.mark.parametrize("device", devices)
def test_weight_norm_parametrization(device):
    """A parametrized weight (weight_norm) is what the layer uses, and its
    gradient reaches the parametrization's own parameters, as with nn.RNN."""
    ours, reference = twins(device, torch.float64)
    for module in (ours, reference):
        torch.nn.utils.parametrizations.weight_norm(module, "weight_hh_l0")
    reference.load_state_dict(ours.state_dict())
    with torch.no_grad():  # a non-trivial scale, so that using the raw weight would show
        ours.parametrizations.weight_hh_l0.original0.mul_(0.5)
        reference.parametrizations.weight_hh_l0.original0.mul_(0.5)
    x = torch.randn(5, 3, 4, dtype=torch.float64, device=device, requires_grad=True)
    out1, h1 = ours(x)
    out2, h2 = reference(x)
    assert_close(out1, out2, torch.float64, "output")
    assert_close(h1, h2, torch.float64, "h_n")
    g1 = torch.autograd.grad(out1.sum(), list(ours.parameters()))
    g2 = torch.autograd.grad(out2.sum(), list(reference.parameters()))
    names = [n for n, _ in ours.named_parameters()]
    assert names == [n for n, _ in reference.named_parameters()]
    for name, a, b in zip(names, g1, g2, strict=True):
        assert_close(a, b, torch.float64, f"grad {name}")


@pytest.mark.parametrize("device", devices)
def test_frozen_input_weights(device):
    """weight_ih and the input frozen (fine-tuning the recurrence only):
    weight_hh and the biases still get nn.RNN's gradients."""
    ours, reference = twins(device, torch.float64)
    for module in (ours, reference):
        module.weight_ih_l0.requires_grad_(False)
    x = torch.randn(5, 3, 4, dtype=torch.float64, device=device)
    trainable = [(n, p) for n, p in ours.named_parameters() if p.requires_grad]
    g1 = torch.autograd.grad(ours(x)[0].sum(), [p for _, p in trainable])
    g2 = torch.autograd.grad(reference(x)[0].sum(), [p for p in reference.parameters() if p.requires_grad])
    for (name, _), a, b in zip(trainable, g1, g2, strict=True):
        assert_close(a, b, torch.float64, f"grad {name}")


@pytest.mark.parametrize("device", devices)
def test_forward_mode_ad_refused(device):
    """Dual input to the module (torch.autograd.forward_ad): a clear error,
    never an output without its tangent."""
    import torch.autograd.forward_ad as fwAD
    ours, _ = twins(device, torch.float64)
    x = torch.randn(5, 3, 4, dtype=torch.float64, device=device)
    with fwAD.dual_level():
        with pytest.raises(RuntimeError, match="forward-mode AD .* is not supported"):
            ours(fwAD.make_dual(x, torch.randn_like(x)))


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("module", [torch.nn.RNN, torch_prnn.PersistentRNN], ids=["nn.RNN", "prnn"])
def test_input_changed_before_backward_raises(device, module):
    """The input (no grad, as data usually is) is saved for w_ih's gradient:
    reusing its buffer before backward is autograd's error, as with nn.RNN,
    not a gradient computed from the new contents."""
    torch.manual_seed(0)
    rnn = module(3, 4, device=device, dtype=torch.float64)
    x = torch.randn(5, 2, 3, device=device, dtype=torch.float64)
    output, _ = rnn(x)
    x.mul_(100)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        output.sum().backward()


@pytest.mark.parametrize("device", devices)
def test_bidirectional_keeps_no_copy_of_the_input(device):
    """Both directions of a layer keep the layer's input itself for backward,
    not a time-reversed copy (which would add an activation per layer)."""
    torch.manual_seed(0)
    rnn = torch_prnn.PersistentRNN(6, 4, num_layers=2, bidirectional=True, device=device, dtype=torch.float64)
    x = torch.randn(5, 3, 6, device=device, dtype=torch.float64)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        rnn(x)
    layer_inputs = [t for t in saved if t.dim() == 3 and t.shape[-1] in (6, 8)]  # [T,B,I], I = 6 then 2H
    assert layer_inputs, "no layer input was saved"
    storages = {t.untyped_storage().data_ptr() for t in layer_inputs}
    assert len(storages) == 2, f"expected one saved input per layer, got {len(storages)} storages"



@needs_cuda
@pytest.mark.parametrize("module", [torch_prnn.PersistentRNN, torch_prnn.PersistentLSTM, torch_prnn.PersistentGRU],
                         ids=lambda m: m.__name__)
def test_packed_call_never_waits_for_the_gpu(module):
    """A packed batch's indices reach the GPU without a synchronising copy (a
    blocking copy from pageable memory waits for every kernel queued before
    it), forward and backward, with hx, both directions and unsorted lengths."""
    rnn = module(5, 7, num_layers=2, bidirectional=True, device="cuda")
    # Packed outside the timed calls (packing unsorted lengths copies its
    # permutation to the GPU), its rows a leaf of their own, so each call's
    # backward has a graph of its own.
    packed = pack_padded_sequence(torch.randn(6, 4, 5, device="cuda"), torch.tensor([3, 6, 1, 4]),
                                  enforce_sorted=False)
    packed = PackedSequence(packed.data.requires_grad_(), *packed[1:])
    h = torch.randn(4, 4, 7, device="cuda", requires_grad=True)
    hx = (h, torch.randn_like(h)) if module is torch_prnn.PersistentLSTM else h
    params = list(rnn.parameters())

    def call():
        output, h_n = rnn(packed, hx)
        h_n = h_n[0] if isinstance(h_n, tuple) else h_n
        return torch.autograd.grad(output.data.pow(2).sum() + h_n.sum(), [packed.data, h] + params)

    expected = call()  # warm: plans, the pinned-memory pool
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        grads = call()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for got, want in zip(grads, expected):  # the same call's gradients
        torch.testing.assert_close(got, want)


class PackedCall(torch.nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x: PackedSequence):
        return self.rnn(x)


@needs_cuda
@pytest.mark.filterwarnings("ignore:`torch.jit.*deprecated:DeprecationWarning")
@pytest.mark.parametrize("scripted", [False, True])
def test_packed_capture_is_refused_clearly(scripted):
    """A packed call's lengths are host data, which a CUDA graph's replay
    would not read again: capturing one is refused with a clear error (the
    module's index copy in eager, the op's lengths copy under TorchScript)."""
    rnn = PackedCall(torch_prnn.PersistentRNN(5, 7, device="cuda"))
    rnn = torch.jit.script(rnn) if scripted else rnn  # a call site of one input type, as nn's
    packed = pack_padded_sequence(torch.randn(6, 4, 5, device="cuda"), torch.tensor([6, 4, 3, 1]))
    rnn(packed)  # warm, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="cannot be captured in a CUDA graph"):
        with torch.cuda.graph(graph):
            rnn(packed)
    torch.cuda.synchronize()
    assert torch.equal(rnn(packed)[0].data, rnn(packed)[0].data)  # the device still works


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_backward_asks_for_h0s_gradient_only_where_h0_needs_one(device, bias, bidirectional):
    """prnn::backward computes grad_h0 (a GEMM) only where h0 requires a
    gradient: hx=None and a hx that requires none skip it; every gradient
    the caller asks for still matches nn.RNN's."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class BackwardCalls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.h0_grad = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.ops.prnn.backward.default:
                self.h0_grad.append(args[6] if len(args) > 6 else kwargs.get("h0_grad", True))
            return func(*args, **kwargs)

    ours, reference = twins(device, torch.float64, bias=bias, bidirectional=bidirectional)
    directions = 2 if bidirectional else 1
    for hx_kind in ("none", "constant", "leaf"):
        x = torch.randn(5, 3, 4, dtype=torch.float64, device=device, requires_grad=True)
        hx = None if hx_kind == "none" else torch.randn(directions, 3, 7, dtype=torch.float64, device=device,
                                                          requires_grad=hx_kind == "leaf")
        leaves = [x] + ([hx] if hx_kind == "leaf" else [])
        results = []
        for module, mode in ((ours, BackwardCalls()), (reference, None)):
            params = list(module.parameters())
            if mode is not None:
                with mode:
                    output, h_n = module(x, hx)
                    grads = torch.autograd.grad((output * output).sum() + h_n.sum(), leaves + params)
                assert mode.h0_grad == [hx_kind == "leaf"] * directions, (hx_kind, mode.h0_grad)
            else:
                output, h_n = module(x, hx)
                grads = torch.autograd.grad((output * output).sum() + h_n.sum(), leaves + params)
            results.append(grads)
        for got, want in zip(*results, strict=True):
            assert_close(got, want, torch.float64, hx_kind)
