"""Reliability (issue 5): bad input at the module level on every device, NaN
and Inf, misaligned and strided storage, a problem beyond every tier,
randomized differential testing against the float64 reference, an
inference-server load from many threads, and bitwise determinism.

Fuzzing knobs (environment):
  PRNN_FUZZ_SECONDS  wall-time budget per device (default 20 on CUDA, 8 on the CPU)
  PRNN_FUZZ_CASES    most cases per device (default 400)
  PRNN_FUZZ_SEED     base seed; case i uses seed base + i (default "fresh": a new one each run, printed)
  PRNN_FUZZ_REPLAY   run only this seed (a failure prints the command)
"""

import copy
import dataclasses
import math
import os
import random
import re
import threading
import time

import pytest
import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

import torch_prnn
from conftest import (
    TOL, assert_close, make_op_inputs, needs_cuda, poison_allocator, reference_final_state, reference_forward,
    rel_err, run_threads, twins,
)
from test_module import as_reference, check_parity, run

forward, backward = torch.ops.prnn.forward, torch.ops.prnn.backward

# Every test here runs under the hang guard (conftest); some set their own limit.
pytestmark = pytest.mark.hang_guard(300)

NAN = float("nan")
REDUCED = (torch.float16, torch.bfloat16)
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]  # CUDA listed (as skipped) without a GPU


def _name(dtype):
    return str(dtype).removeprefix("torch.")


def _device_dtypes(cpu, cuda):
    return [pytest.param("cpu", d, id=f"cpu-{_name(d)}") for d in cpu] + [
        pytest.param("cuda", d, id=f"cuda-{_name(d)}", marks=needs_cuda) for d in cuda
    ]


# CUDA float64 runs on the stepwise tier. The CPU runs bfloat16 in float32:
# the op-level tests take it there too, to run their reduced-precision logic.
CUDA_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
DEVICE_DTYPES = _device_dtypes([torch.float32, torch.float64], CUDA_DTYPES)
OP_DEVICE_DTYPES = _device_dtypes([torch.float32, torch.float64, torch.bfloat16], CUDA_DTYPES)


def sync(device):
    """On CUDA, wait for the device: an error a call left behind surfaces here."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def misaligned(t):
    """A copy of `t` at storage offset 1 of a larger (NaN-filled) buffer: its
    data pointer is 2, 4 or 8 bytes past an aligned address."""
    buf = torch.full((t.numel() + 1,), NAN, dtype=t.dtype, device=t.device)
    view = buf[1:].view(t.shape)
    view.copy_(t)
    assert view.data_ptr() % 16 != 0
    return view


def every_other(t):
    """A copy of `t` in every other element of the last dimension of a NaN-filled buffer."""
    buf = torch.full((*t.shape[:-1], 2 * t.shape[-1]), NAN, dtype=t.dtype, device=t.device)
    view = buf[..., ::2]
    view.copy_(t)
    return view


def _bits(t):
    """`t`'s bits as integers, so that NaN compares equal to itself."""
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


def float64_twin(ours, device="cpu"):
    """A float64 nn.RNN on `device` with `ours`'s configuration and weights."""
    kwargs = dict(
        input_size=ours.input_size, hidden_size=ours.hidden_size, num_layers=ours.num_layers,
        nonlinearity=ours.nonlinearity, bias=ours.bias, batch_first=ours.batch_first,
        bidirectional=ours.bidirectional,
    )
    reference = torch.nn.RNN(**kwargs, device=device, dtype=torch.float64)
    reference.load_state_dict(ours.state_dict())
    return reference


def assert_still_works(ours, reference):
    """A correct call on the same module after a bad one, against the float64
    twin `reference` (on any device); on CUDA, then a synchronize."""
    p = ours.weight_hh_l0
    shape = (3, 5, ours.input_size) if ours.batch_first else (5, 3, ours.input_size)
    x = torch.randn(shape, device=p.device, dtype=p.dtype)
    out, h_n = ours(x)
    ref_device = reference.weight_hh_l0.device
    ref_out, ref_h = reference(x.to(ref_device, torch.float64))
    assert_close(out, ref_out, p.dtype, "output of a good call after the bad one")
    assert_close(h_n, ref_h, p.dtype, "h_n of a good call after the bad one")
    sync(p.device)


# ---- 1. bad input at the module level ---------------------------------------
# (test_module.py runs its BAD_CALLS on every device too; these are the rest.)
# A 2-layer bidirectional float32 module: input_size 4, hidden_size 7, so hx
# is [4, batch, 7].


def _randn(*shape, dtype=torch.float32):
    return lambda d: torch.randn(*shape, dtype=dtype, device=d)


def _packed(d, dtype=torch.float32, features=4, enforce_sorted=True):
    x = torch.randn(5, 3, features, dtype=dtype, device=d)
    lengths = torch.tensor([5, 3, 2]) if enforce_sorted else torch.tensor([3, 5, 2])
    return pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)


# (id, module options, make(device) -> (input, hx)). nn.RNN's behaviour is the
# expectation: its exception type and exact message, or, where it accepts the
# call, its result shapes and values.
LIKE_NN_RNN = [
    ("int64 input", {}, lambda d: (torch.randint(-2, 3, (5, 3, 4), device=d), None)),
    ("bool input", {}, lambda d: (torch.ones(5, 3, 4, dtype=torch.bool, device=d), None)),
    ("float16 input", {}, lambda d: (_randn(5, 3, 4, dtype=torch.float16)(d), None)),
    ("unbatched float64 input", {}, lambda d: (_randn(5, 4, dtype=torch.float64)(d), None)),
    ("packed float64 input", {}, lambda d: (_packed(d, torch.float64), None)),
    ("0-D input", {}, lambda d: (torch.tensor(1.0, device=d), None)),
    ("1-D input", {}, lambda d: (_randn(4)(d), None)),
    ("4-D batch_first input", {"batch_first": True}, lambda d: (_randn(3, 5, 4, 1)(d), None)),
    ("unbatched input_size", {}, lambda d: (_randn(5, 6)(d), None)),
    ("batch_first input_size", {"batch_first": True}, lambda d: (_randn(3, 5, 2)(d), None)),
    ("packed input_size", {}, lambda d: (_packed(d, features=5), None)),
    ("hx hidden_size", {}, lambda d: (_randn(5, 3, 4)(d), _randn(4, 3, 8)(d))),
    ("hx layers", {}, lambda d: (_randn(5, 3, 4)(d), _randn(2, 3, 7)(d))),
    ("hx batch, batch_first", {"batch_first": True}, lambda d: (_randn(3, 5, 4)(d), _randn(4, 5, 7)(d))),
    ("hx 4-D", {}, lambda d: (_randn(5, 3, 4)(d), _randn(4, 3, 7, 1)(d))),
    ("unbatched hx size", {}, lambda d: (_randn(5, 4)(d), _randn(4, 8)(d))),
    ("unbatched hx 1-D", {}, lambda d: (_randn(5, 4)(d), _randn(7)(d))),
    ("packed hx batch", {}, lambda d: (_packed(d), _randn(4, 2, 7)(d))),
    ("packed hx 2-D", {}, lambda d: (_packed(d), _randn(4, 7)(d))),
    # T = 0 and B = 0
    ("T=0, B=0", {}, lambda d: (_randn(0, 0, 4)(d), None)),
    ("T=0 batch_first", {"batch_first": True}, lambda d: (_randn(3, 0, 4)(d), None)),
    ("T=0 with hx", {}, lambda d: (_randn(0, 3, 4)(d), _randn(4, 3, 7)(d))),
    ("B=0 with hx", {}, lambda d: (_randn(5, 0, 4)(d), _randn(4, 0, 7)(d))),
    ("B=0 batch_first", {"batch_first": True}, lambda d: (_randn(0, 5, 4)(d), None)),
    ("B=0, hx batch 1", {}, lambda d: (_randn(5, 0, 4)(d), _randn(4, 1, 7)(d))),
    ("B=0, input_size", {}, lambda d: (_randn(5, 0, 6)(d), None)),
    ("zero features", {}, lambda d: (_randn(5, 3, 0)(d), None)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,options,make", LIKE_NN_RNN, ids=[c[0] for c in LIKE_NN_RNN])
def test_bad_input_like_nn_rnn(device, name, options, make):
    ours, reference = twins(device, torch.float32, num_layers=2, bidirectional=True, **options)
    theirs = copy.deepcopy(reference).float()  # the dtype is in some messages
    input, hx = make(device)
    try:
        expected = theirs(input, hx)
    except Exception as error:  # noqa: BLE001 - the expectation
        with pytest.raises(type(error), match=f"^{re.escape(str(error))}$"):
            ours(input, hx)
    else:  # nn.RNN accepts it: the same shapes, and the float64 values
        out, h_n = ours(input, hx)
        ref_out, ref_h = reference(as_reference(input), as_reference(hx))
        data = getattr(out, "data", out)
        assert data.shape == getattr(expected[0], "data", expected[0]).shape
        assert h_n.shape == expected[1].shape and data.dtype == h_n.dtype == torch.float32
        assert_close(data, getattr(ref_out, "data", ref_out), torch.float32, "output")
        assert_close(h_n, ref_h, torch.float32, "h_n")
    assert_still_works(ours, reference)


# nn.RNN raises these with other words (on the CPU, "mat1 and mat2 must have
# the same dtype"); ours names the op's argument (h0 is a layer's slice of hx).
HX_DTYPE = [
    ("hx float16", lambda d: (_randn(5, 3, 4)(d), _randn(4, 3, 7, dtype=torch.float16)(d)), "Half"),
    ("hx int64", lambda d: (_randn(5, 3, 4)(d), torch.zeros(4, 3, 7, dtype=torch.long, device=d)), "Long"),
    ("unbatched hx float64", lambda d: (_randn(5, 4)(d), _randn(4, 7, dtype=torch.float64)(d)), "Double"),
    ("packed hx float64", lambda d: (_packed(d), _randn(4, 3, 7, dtype=torch.float64)(d)), "Double"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,make,got", HX_DTYPE, ids=[c[0] for c in HX_DTYPE])
def test_hx_dtype(device, name, make, got):
    ours, reference = twins(device, torch.float32, num_layers=2, bidirectional=True)
    input, hx = make(device)
    if device == "cpu":  # nn.RNN's exception type (not tried on CUDA: cuDNN's checks are its own)
        with pytest.raises(RuntimeError):
            copy.deepcopy(reference).float()(input, hx)
    with pytest.raises(RuntimeError, match=rf"^prnn::forward: h0 must have the dtype of xp \(Float\), got {got}"):
        ours(input, hx)
    assert_still_works(ours, reference)


# Module, input and hx devices. nn.RNN raises RuntimeError for all of these; it
# is not called here, since cuDNN with host pointers is not a risk worth
# taking in a shared CUDA context. Ours must raise RuntimeError about devices
# and leave the module and the context working. Where the module's device
# differs from the input's, the error is torch's own, from the input
# projection (F.linear: "Expected all tensors to be on the same device ...");
# a packed input's hx on another device fails in hx.index_select, as in
# nn.RNN; otherwise the op names its argument.
MIXED_DEVICES = [  # (module, input, hx); hx None: the default zeros
    ("cpu", "cuda", None), ("cuda", "cpu", None), ("cuda", "cuda", "cpu"),
    ("cpu", "cpu", "cuda"), ("cuda", "cpu", "cpu"), ("cpu", "cuda", "cuda"),
]


@needs_cuda
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("module_device,input_device,hx_device", MIXED_DEVICES)
def test_mixed_devices(module_device, input_device, hx_device, packed):
    ours, reference = twins(module_device, torch.float32, num_layers=2, bidirectional=True)
    x = torch.randn(5, 3, 4, device=input_device)
    input = pack_padded_sequence(x, torch.tensor([3, 5, 2]), enforce_sorted=False) if packed else x
    hx = None if hx_device is None else torch.randn(4, 3, 7, device=hx_device)
    message = r"(?i)device"
    if module_device == input_device and not packed:
        message = rf"^prnn::forward: h0 must be on the device of xp \({input_device}(:0)?\), got {hx_device}"
    with pytest.raises(RuntimeError, match=message):
        ours(input, hx)
    assert_still_works(ours, reference)
    torch.cuda.synchronize()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hx_shape", [(4, 2, 7), (4, 4, 7), (4, 7), (4, 3, 8)], ids=str)
def test_unsorted_packed_hx_shape(device, hx_shape):
    """Packed input with enforce_sorted=False reorders hx's batch. nn.RNN does
    that before checking hx's shape: a batch of 2 for 3 sequences indexes out
    of range (on CUDA, a device-side assert that ends the process's CUDA
    context), a batch of 4 silently loses a row, a 2-D hx is reported by the
    shape of its reordered copy. Ours checks first, with nn.RNN's message."""
    ours, reference = twins(device, torch.float32, num_layers=2, bidirectional=True)
    packed = _packed(device, enforce_sorted=False)
    hx = torch.randn(hx_shape, device=device)
    with pytest.raises(RuntimeError, match=re.escape(f"Expected hidden size (4, 3, 7), got {list(hx_shape)}")):
        ours(packed, hx)
    assert_still_works(ours, reference)


@pytest.mark.parametrize("device", DEVICES)
def test_packed_unsorted_lengths(device):
    """enforce_sorted=True with unsorted lengths is torch's error, before any
    module; enforce_sorted=False works (test_module.test_packed: values)."""
    ours, reference = twins(device, torch.float32, num_layers=2, bidirectional=True)
    x = torch.randn(6, 4, 4, device=device)
    with pytest.raises(RuntimeError, match="must be sorted in decreasing order when `enforce_sorted` is True"):
        pack_padded_sequence(x, torch.tensor([3, 6, 1, 4]), enforce_sorted=True)
    packed = pack_padded_sequence(x, torch.tensor([3, 6, 1, 4]), enforce_sorted=False)
    out, h_n = ours(packed)
    ref_out, ref_h = reference(as_reference(packed))
    assert_close(out.data, ref_out.data, torch.float32, "output")
    assert_close(h_n, ref_h, torch.float32, "h_n")
    assert_still_works(ours, reference)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch_sizes,rows", [([3, 0, 2], 5), ([2, 3], 5), ([3, 2], 6), ([3, 2], 4)])
def test_malformed_packed_sequence(device, batch_sizes, rows):
    """A hand-built PackedSequence that pack_padded_sequence never makes:
    growing batch sizes, or a row count that is not their sum. nn.RNN raises
    RuntimeError for most (its words are about broadcasting; [3, 2] with 6
    rows it runs, ignoring a row); ours says what is wrong, and never runs
    with lengths read from a malformed batch_sizes."""
    ours, reference = twins(device, torch.float32, num_layers=2, bidirectional=True)
    packed = PackedSequence(torch.randn(rows, 4, device=device), torch.tensor(batch_sizes))
    with pytest.raises(RuntimeError, match=re.escape(f"batch_sizes {batch_sizes} for {rows} rows")):
        ours(packed)
    assert_still_works(ours, reference)


@pytest.mark.parametrize("device", DEVICES)
def test_packed_trailing_empty_steps(device):
    """batch_sizes ending in zeros (hand-built; steps where no sequence is left):
    nn.RNN runs it, and so do we, with its values."""
    ours, reference = twins(device, torch.float32, num_layers=2, bidirectional=True)
    reference = reference.cpu()  # cuDNN refuses such batch_sizes (CUDNN_STATUS_BAD_PARAM)
    packed = PackedSequence(torch.randn(5, 4, device=device), torch.tensor([3, 2, 0, 0]))
    out, h_n = ours(packed)
    ref_out, ref_h = reference(as_reference(PackedSequence(packed.data.cpu(), packed.batch_sizes)))
    assert out.data.shape == ref_out.data.shape and h_n.shape == ref_h.shape
    assert_close(out.data, ref_out.data, torch.float32, "output")
    assert_close(h_n, ref_h, torch.float32, "h_n")
    assert_still_works(ours, reference)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_packed_sequence(device):
    """A hand-built PackedSequence with no rows (batch_sizes [0]): nn.RNN
    returns an empty output and a [layers*directions, 0, hidden] h_n."""
    ours, reference = twins(device, torch.float32, num_layers=2, bidirectional=True)
    packed = PackedSequence(torch.randn(0, 4, device=device), torch.tensor([0]))
    out, h_n = ours(packed)
    ref_out, ref_h = reference.cpu()(as_reference(PackedSequence(packed.data.cpu(), packed.batch_sizes)))
    assert out.data.shape == ref_out.data.shape == (0, 14)
    assert h_n.shape == ref_h.shape == (4, 0, 7)
    assert_still_works(ours, reference)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("where", ["hx", "lengths"])
def test_argument_on_meta_device(device, where):
    """A meta tensor beside real ones: the dispatcher routes the call to the
    meta (fake) kernel, which must refuse it like the real kernels do, not
    return an uninitialised tensor of the real device."""
    ours, reference = twins(device, torch.float32, num_layers=2, bidirectional=True)
    if where == "hx":
        with pytest.raises(RuntimeError, match=r"^prnn::forward: h0 must be on the device of xp \(\w+(:0)?\), got meta"):
            ours(torch.randn(5, 3, 4, device=device), torch.randn(4, 3, 7, device="meta"))
    else:
        xp, h0, w = make_op_inputs(4, 3, 7, torch.float32, device)
        with pytest.raises(RuntimeError, match=r"^prnn::forward: lengths must be a CPU tensor .* got one on meta"):
            forward(xp, h0, w, torch.tensor([4, 2, 9], device="meta"), "tanh")
    assert_still_works(ours, reference)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["xp", "h0", "w_hh", "grad_y"])
def test_op_none_for_a_tensor(device, name):
    """None for a Tensor argument of the raw ops names the argument."""
    xp, h0, w = make_op_inputs(4, 3, 7, torch.float32, device)
    args = {"xp": xp, "h0": h0, "w_hh": w}
    if name == "grad_y":
        y, _ = forward(xp, h0, w, None, "tanh")
        with pytest.raises(RuntimeError, match=r"^prnn::backward: grad_y must be a tensor, got None"):
            backward(None, y, h0, w, None, "tanh")
    else:
        args[name] = None
        with pytest.raises(RuntimeError, match=rf"^prnn::forward: {name} must be a tensor, got None"):
            forward(args["xp"], args["h0"], args["w_hh"], None, "tanh")
    assert_close(forward(xp, h0, w, None, "tanh")[0], reference_forward(xp, h0, w), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transform", ["jvp", "jacfwd", "grad", "jacrev", "vjp"])
def test_func_autodiff_transforms_refused(device, transform):
    """torch.func's autodiff transforms cannot see through the op (its
    autograd is a C++ autograd Function). The module refuses them all with
    one message."""
    ours, reference = twins(device, torch.float64)
    x = torch.randn(5, 3, 4, dtype=torch.float64, device=device)
    calls = {
        "jvp": lambda: torch.func.jvp(lambda a: ours(a)[0], (x,), (torch.randn_like(x),)),
        "jacfwd": lambda: torch.func.jacfwd(lambda a: ours(a)[1].sum())(x),
        "grad": lambda: torch.func.grad(lambda a: ours(a)[0].sum())(x),
        "jacrev": lambda: torch.func.jacrev(lambda a: ours(a)[1].sum())(x),
        "vjp": lambda: torch.func.vjp(lambda a: ours(a)[0], x),
    }
    with pytest.raises(RuntimeError, match="does not support torch.func's autodiff transforms"):
        calls[transform]()
    assert_still_works(ours, reference)


@pytest.mark.parametrize("device", DEVICES)
def test_vmap_over_inputs(device):
    """torch.vmap (no autodiff) runs, with nn.RNN's values per sample."""
    ours, reference = twins(device, torch.float64)
    xs = torch.randn(2, 5, 3, 4, dtype=torch.float64, device=device)
    out = torch.vmap(lambda a: ours(a)[0])(xs)
    for i in range(2):
        assert_close(out[i], reference(xs[i])[0], torch.float64, f"vmap sample {i}")


def test_constructor_rejects_proj_size():
    """nn.RNN's error for proj_size; its proj_size attribute (0) exists."""
    with pytest.raises(ValueError, match="proj_size argument is only supported for LSTM, not RNN or GRU"):
        torch_prnn.PersistentRNN(4, 7, proj_size=0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'projection'"):
        torch_prnn.PersistentRNN(4, 7, projection=2)
    assert torch_prnn.PersistentRNN(4, 7).proj_size == torch.nn.RNN(4, 7).proj_size == 0


# ---- NaN and Inf --------------------------------------------------------------


def assert_same_nonfinite(out, ref, dtype, what):
    """Same NaN and Inf positions (and signs) as the reference; the elements
    finite in both within the dtype's tolerance."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    nan, ref_nan = out.isnan(), ref.isnan()
    assert torch.equal(nan, ref_nan), (
        f"{what}: NaN at {nan.sum()} positions, the reference at {ref_nan.sum()}; "
        f"first difference at {(nan != ref_nan).nonzero()[0].tolist()}"
    )
    inf, ref_inf = out.isinf(), ref.isinf()
    assert torch.equal(inf, ref_inf), (
        f"{what}: Inf at {inf.sum()} positions, the reference at {ref_inf.sum()}"
    )
    assert torch.equal(out[inf], ref[ref_inf]), f"{what}: Inf of the other sign"
    finite = out.isfinite()
    if finite.any():
        assert_close(out[finite], ref[finite], dtype, f"{what} (finite elements)")


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
@pytest.mark.parametrize("value", [NAN, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["input", "hx"])
def test_nonfinite_propagates_like_nn_rnn(device, dtype, nonlinearity, value, where):
    """One NaN / Inf in the input or in hx: the outputs have NaN and Inf
    exactly where a float64 nn.RNN (CPU) with the same weights has them, and
    the rest matches; the other sequences of the batch stay untouched; no hang.
    With NaN and tanh also the gradients (their NaN pattern does not depend on
    0 * NaN conventions: every affected delta is NaN)."""
    T, B, I, H = 6, 3, 5, 33
    layers = 1 if dtype == torch.bfloat16 else 2  # as in test_module_layouts
    ours = torch_prnn.PersistentRNN(
        I, H, num_layers=layers, nonlinearity=nonlinearity, bidirectional=True, device=device, dtype=dtype
    )
    reference = float64_twin(ours)
    x = torch.randn(T, B, I, device=device, dtype=dtype)
    hx = 0.5 * torch.randn(2 * layers, B, H, device=device, dtype=dtype)
    if where == "input":
        x[2, 1, 3] = value
    else:
        hx[1, 2, 5] = value  # layer 0, reverse direction, sequence 2
    x.requires_grad_()
    hx.requires_grad_()
    out, h_n = ours(x, hx)
    x64, hx64 = (as_reference(t.detach().cpu()) for t in (x, hx))
    ref_out, ref_h = reference(x64, hx64)
    assert_same_nonfinite(out, ref_out, dtype, "output")
    assert_same_nonfinite(h_n, ref_h, dtype, "h_n")
    assert ref_out[:, 0].isfinite().all(), "sequence 0 is never touched: the test is meaningful"
    if value != value:  # NaN always reaches the output (it survives tanh and relu)
        assert ref_out.isnan().any()
    if value != value and nonlinearity == "tanh":
        g_out, g_h = torch.randn(ref_out.shape, dtype=torch.float64), torch.randn(ref_h.shape, dtype=torch.float64)
        grads = torch.autograd.grad((out, h_n), [x, hx, *ours.parameters()], (g_out.to(out), g_h.to(h_n)))
        ref_grads = torch.autograd.grad((ref_out, ref_h), [x64, hx64, *reference.parameters()], (g_out, g_h))
        names = ["input", "hx"] + [n for n, _ in ours.named_parameters()]
        for name, g, r in zip(names, grads, ref_grads, strict=True):
            assert_same_nonfinite(g, r, dtype, f"grad {name}")
    assert_still_works(ours, reference)


@pytest.mark.parametrize("device,dtype", OP_DEVICE_DTYPES)
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_nan_past_lengths_is_never_read(device, dtype, nonlinearity):
    """Past a sequence's length the op defines y = 0 and a zero delta, so NaN
    there in xp or grad_y (say, padding from torch.empty) changes nothing."""
    T, B, H = 7, 5, 33
    lengths = torch.tensor([7, 3, 0, 1, 5])
    dead = (torch.arange(T).unsqueeze(1) >= lengths).to(device)  # T x B
    xp = torch.randn(T, B, H, device=device).to(dtype)
    h0 = (0.5 * torch.randn(B, H, device=device)).to(dtype)
    w = ((torch.rand(H, H, device=device) * 2 - 1) * H**-0.5).to(dtype)
    grad_y = torch.randn(T, B, H, device=device).to(dtype)
    leaves = [xp.masked_fill(dead.unsqueeze(-1), NAN).requires_grad_(), h0.requires_grad_(), w.requires_grad_()]
    y, _ = forward(*leaves, lengths, nonlinearity)
    grads = torch.autograd.grad(y, leaves, grad_y.masked_fill(dead.unsqueeze(-1), NAN))
    # The reference sees finite padding: the op must not care what is there.
    ref_leaves = [t.detach().double().requires_grad_() for t in (xp, h0, w)]
    y_ref = reference_forward(*ref_leaves, lengths, nonlinearity, act_grad_from=y if dtype in REDUCED else None)
    ref_grads = torch.autograd.grad(y_ref, ref_leaves, grad_y.double())
    assert (y[dead] == 0).all() and (grads[0][dead] == 0).all()
    assert_close(y, y_ref, dtype, "y")
    for name, g, r in zip(("grad_xp", "grad_h0", "grad_w_hh"), grads, ref_grads):
        assert_close(g, r, dtype, name)
    sync(device)


# ---- misaligned and strided storage ----------------------------------------


@pytest.mark.parametrize("device,dtype", OP_DEVICE_DTYPES)
@pytest.mark.parametrize("which", ["xp", "h0", "w_hh", "grad_y", "y", "all"])
@pytest.mark.parametrize("T,B,H", [(9, 3, 129), (4, 2, 1025)], ids=["H129", "H1025-cuda-H65-cpu"])
def test_misaligned_op_arguments(device, dtype, which, T, B, H):
    """Arguments whose data pointer is not 16-byte aligned (storage offset 1
    of a larger buffer), forward and backward, against the float64 loop."""
    if device == "cpu" and H > 129:
        H = 65  # the CPU float64 loop at H = 1025 costs a second per case
    xp = torch.randn(T, B, H, device=device).to(dtype)
    h0 = (0.5 * torch.randn(B, H, device=device)).to(dtype)
    w = ((torch.rand(H, H, device=device) * 2 - 1) * H**-0.5).to(dtype)
    grad_y = torch.randn(T, B, H, device=device).to(dtype)
    lengths = torch.tensor([T] + [max(0, T - 1 - i) for i in range(B - 1)])
    args = {"xp": xp, "h0": h0, "w_hh": w}
    args = {k: misaligned(v) if which in (k, "all") else v for k, v in args.items()}
    y, _ = forward(*args.values(), lengths, "tanh")
    y_arg = misaligned(y) if which in ("y", "all") else y
    g_arg = misaligned(grad_y) if which in ("grad_y", "all") else grad_y
    grads = backward(g_arg, y_arg, args["h0"], args["w_hh"], lengths, "tanh")
    leaves = [t.detach().double().requires_grad_() for t in (xp, h0, w)]
    y_ref = reference_forward(*leaves, lengths, "tanh", act_grad_from=y if dtype in REDUCED else None)
    assert_close(y, y_ref, dtype, "y")
    ref_grads = torch.autograd.grad(y_ref, leaves, grad_y.double())
    for name, g, r in zip(("grad_xp", "grad_h0", "grad_w_hh"), grads, ref_grads):
        assert_close(g, r, dtype, name)
    sync(device)


MODULE_LAYOUTS = ["misaligned", "every_other", "batch_first_transposed", "expanded_hx", "expanded_grad", "scalar_grad"]


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("layout", MODULE_LAYOUTS)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["1-layer", "bidirectional"])
def test_module_layouts(device, dtype, layout, bidirectional):
    """Input, hx and the output's gradient in unusual storage (bidirectional:
    two layers, one in bfloat16, see below): misaligned,
    every other element, batch_first views of time-major memory, stride-0
    expansions. Only the output is differentiated, so that its gradient
    reaches prnn::backward as given (through the last layer's slice of it):
    with h_n in the loss, autograd would sum both into a fresh tensor. Outputs
    and every gradient against the float64 nn.RNN."""
    T, B, I, H = 16, 4, 6, 33
    # bfloat16 end to end through two layers has a systematic error near half
    # its tolerance (per-step-rounding emulation: median 0.5, tail 0.8): one
    # bidirectional layer still slices the output's gradient per direction.
    layers = 2 if bidirectional and dtype != torch.bfloat16 else 1
    L, O = layers * (1 + bidirectional), H * (1 + bidirectional)
    batch_first = layout == "batch_first_transposed"
    ours, reference = twins(
        device, dtype, input_size=I, hidden_size=H, num_layers=layers, bidirectional=bidirectional,
        batch_first=batch_first,
    )
    new = lambda *shape, scale=1.0: (scale * torch.randn(*shape, device=device)).to(dtype)  # noqa: E731
    x, hx, g_out = new(T, B, I), new(L, B, H, scale=0.5), new(T, B, O)
    if layout == "misaligned":
        x, hx, g_out = map(misaligned, (x, hx, g_out))
    elif layout == "every_other":
        x, hx, g_out = map(every_other, (x, hx, g_out))
    elif layout == "batch_first_transposed":  # B x T views of T x B memory
        x, g_out = x.transpose(0, 1), g_out.transpose(0, 1)
    elif layout == "expanded_hx":
        hx = new(1, 1, H, scale=0.5)  # the leaf; the module gets its expansion
    elif layout == "expanded_grad":  # strides (0, 0, 1)
        g_out = new(O).expand_as(g_out)
    elif layout == "scalar_grad":  # all strides 0
        g_out = new(1).squeeze().expand_as(g_out)
    x_leaf, hx_leaf = x.detach().requires_grad_(), hx.detach().requires_grad_()
    expand = (lambda h: h.expand(L, B, H)) if layout == "expanded_hx" else (lambda h: h)
    out, h_n = ours(x_leaf, expand(hx_leaf))
    grads = torch.autograd.grad(out, [x_leaf, hx_leaf, *ours.parameters()], g_out)
    x64, hx64 = (as_reference(t) for t in (x, hx))  # fresh contiguous copies: cuDNN wants them
    ref_out, ref_h = reference(x64, expand(hx64).contiguous())
    ref_grads = torch.autograd.grad(ref_out, [x64, hx64, *reference.parameters()], g_out.double())
    assert_close(out, ref_out, dtype, "output")
    assert_close(h_n, ref_h, dtype, "h_n")
    names = ["input", "hx"] + [n for n, _ in ours.named_parameters()]
    for name, g, r in zip(names, grads, ref_grads, strict=True):
        assert g.shape == r.shape and g.dtype == dtype, name
        assert_close(g, r, dtype, f"grad {name}")
    sync(device)


# ---- beyond every tier ------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=_name)
def test_beyond_every_tier_names_the_limit(dtype):
    """hidden = 32769 is one past the stepwise tier's limit (its workspace
    holds a copy of W_hh) and far past the on-chip tiers: a clear error naming
    the limit, not a launch. W_hh is a stride-0 expansion of one row, which the
    shim accepts, so the call costs a few hundred KB."""
    H = 32769
    for pass_is_backward in (False, True):
        plan = torch_prnn.plan(H, dtype=dtype, device="cuda", backward=pass_is_backward)
        assert plan["tier"] == "none", plan
    xp = torch.randn(1, 1, H, device="cuda", dtype=dtype)
    h0 = torch.randn(1, H, device="cuda", dtype=dtype)
    w = (torch.randn(1, H, device="cuda") * H**-0.5).to(dtype).expand(H, H)
    assert w.stride() == (0, 1)
    limit = f"PRNN_STATUS_NOT_SUPPORTED: hidden={H} is larger than the largest supported hidden size, 32768"
    with pytest.raises(NotImplementedError, match=re.escape(f"prnn::forward: {limit}")):
        forward(xp, h0, w, None, "tanh")
    y = torch.tanh(xp)
    with pytest.raises(NotImplementedError, match=re.escape(f"prnn::backward: {limit}")):
        backward(torch.randn_like(y), y, h0, w, torch.tensor([1]), "tanh")
    torch.cuda.synchronize()
    xp, h0, w = make_op_inputs(5, 2, 1024, dtype, "cuda")
    assert_close(forward(xp, h0, w, None, "tanh")[0], reference_forward(xp, h0, w), dtype, "a good call")
    torch.cuda.synchronize()


@needs_cuda
def test_too_many_steps_names_the_limit():
    """steps = 2^31 (an expanded xp; the shim still allocates y and a copy of
    xp, 8 GiB, before the plan refuses it)."""
    if torch.cuda.mem_get_info()[0] < 16 * 2**30:
        pytest.skip("needs 16 GiB of free device memory")
    T = 2**31
    xp = torch.randn(1, 1, 1, device="cuda", dtype=torch.bfloat16).expand(T, 1, 1)
    h0 = torch.randn(1, 1, device="cuda", dtype=torch.bfloat16)
    w = torch.full((1, 1), 0.5, device="cuda", dtype=torch.bfloat16)
    message = (f"prnn::forward: PRNN_STATUS_NOT_SUPPORTED: steps, batch and hidden must be < 2^31, "
               f"got steps={T} batch=1 hidden=1")
    try:
        with pytest.raises(NotImplementedError, match=re.escape(message)):
            forward(xp, h0, w, None, "tanh")
    finally:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    assert_close(forward(xp[:5], h0, w, None, "tanh")[0], reference_forward(xp[:5], h0, w), torch.bfloat16)


# ---- 2. randomized differential testing ------------------------------------

# A fresh base seed each run (printed with every case), or PRNN_FUZZ_SEED's.
_SEED = os.environ.get("PRNN_FUZZ_SEED", "fresh")
FUZZ_SEED = random.SystemRandom().randrange(2**31) if _SEED == "fresh" else int(_SEED)
# A bound is the larger of TOL[dtype] and this factor times the error of
# torch's own computation in the case's dtype against float64 (a draw where
# rounding moves a pre-activation across relu's kink moves torch's too).
TORCH_ERROR_FACTOR = 4.0
FUZZ_CASES = int(os.environ.get("PRNN_FUZZ_CASES", "400"))
BOUNDARY_H = (1, 2, 3, 7, 8, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513, 1023, 1024, 1025)
BOUNDARY_B = (1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 20)
# Layouts of each op argument (see _place); the first, contiguous, is drawn more often.
OP_LAYOUTS = {
    "xp": ("contiguous", "padded", "strided_batch", "every_other", "batch_first", "misaligned"),
    "h0": ("contiguous", "padded", "expanded", "every_other", "misaligned"),
    "w_hh": ("contiguous", "padded", "transposed", "every_other", "misaligned"),
    "grad_y": ("contiguous", "padded", "batch_first", "expanded", "expanded_all", "every_other", "misaligned"),
    "y": ("contiguous", "padded", "batch_first", "misaligned"),
    "lengths": ("contiguous", "strided"),
}
MODULE_INPUT_LAYOUTS = ("contiguous", "batch_swapped", "every_other", "misaligned")
MODULE_HX_LAYOUTS = ("contiguous", "expanded", "every_other", "misaligned")


@dataclasses.dataclass
class FuzzCase:
    seed: int
    device: str
    path: str  # "forward" | "autograd" | "explicit" (the backward op) | "module"
    dtype: torch.dtype
    nonlinearity: str
    T: int
    B: int
    H: int
    lengths: list | None
    layouts: dict
    module: dict | None = None

    def __str__(self):
        s = f"{self.path} {self.device} {_name(self.dtype)} {self.nonlinearity} T={self.T} B={self.B} H={self.H}"
        if self.module is not None:
            s += " " + " ".join(f"{k}={v}" for k, v in self.module.items())
        s += f" lengths={self.lengths}" if self.lengths is not None else " no lengths"
        return s + " layouts " + " ".join(f"{k}={v}" for k, v in self.layouts.items())


def _choose(rng, options):
    """The first option (contiguous) with probability 0.4, else any other."""
    return options[0] if rng.random() < 0.4 else rng.choice(options[1:])


def _draw_hidden(rng, most):
    r = rng.random()
    if r < 0.45:
        return rng.choice([h for h in BOUNDARY_H if h <= most])
    if r < 0.75:
        return min(most, 2 * rng.randrange((most + 1) // 2) + 1)  # odd
    return rng.randint(1, most)


def _draw_steps(rng, most):
    r = rng.random()
    if r < 0.2:
        return rng.choice((1, 2, 3))
    if r < 0.3:
        return most
    return min(most, int(math.exp(rng.uniform(0, math.log(most + 1)))))  # log-uniform


def _draw_lengths(rng, T, B, least=0):
    kind = rng.choice(("random", "random", "full", "zeros", "sorted", "one_full"))
    if kind == "full":
        return [T] * B
    if kind == "zeros":
        return [max(least, 0)] * B
    lengths = [rng.randint(least, T) for _ in range(B)]
    if kind == "sorted":
        lengths.sort(reverse=True)
    if kind == "one_full":
        lengths[rng.randrange(B)] = T
    return lengths


def draw_case(seed, device):
    """The problem of one seed on one device: sizes biased to boundaries and odd
    values, dtype, activation, lengths, argument layouts, and the path."""
    rng = random.Random(seed)
    cuda = device == "cuda"
    if cuda:
        dtype = rng.choices((torch.float32, torch.bfloat16, torch.float16, torch.float64), (3, 3, 3, 1))[0]
    else:
        dtype = rng.choice((torch.float32, torch.float64))
    path = rng.choices(("forward", "autograd", "explicit", "module"), (15, 35, 25, 25))[0]
    nonlinearity = rng.choice(("tanh", "relu"))
    # The CPU reference loop costs T * B * H^2: small H there keeps a case ~50 ms.
    H = _draw_hidden(rng, 1100 if cuda else 64)
    B = rng.choice(BOUNDARY_B) if rng.random() < 0.6 else rng.randint(1, 20)
    if path != "module":
        T = _draw_steps(rng, 300)
        lengths = _draw_lengths(rng, T, B) if rng.random() < 0.5 else None
        names = ["xp", "h0", "w_hh"] + {"explicit": ["grad_y", "y"], "autograd": ["grad_y"]}.get(path, [])
        layouts = {n: _choose(rng, OP_LAYOUTS[n]) for n in names}
        if lengths is not None:
            layouts["lengths"] = _choose(rng, OP_LAYOUTS["lengths"])
        return FuzzCase(seed, device, path, dtype, nonlinearity, T, B, H, lengths, layouts)
    T = _draw_steps(rng, 64)
    if dtype in REDUCED:
        # This path compares gradients end to end with nn.RNN in float64. The
        # GPU kernels round the state to 16 bits every step, which moves some
        # pre-activations across relu's kink: each such element's derivative
        # is off by 1, a few percent norm-wise in all. So 16-bit relu is left
        # to the op paths (their reference takes act' from the op's y), and
        # sizes are kept where a few saturated tanh elements (1 - y^2 of a
        # rounded y) cannot dominate; bfloat16 (8 mantissa bits) gets one
        # layer. Measured with a per-step-rounding emulation of the kernels:
        # the worst case of 100 then reaches 0.65 of TOL (bfloat16; with two
        # layers 0.9), float16 0.1.
        nonlinearity = "tanh"
        T, B, H = max(T, 8), max(B, 4), max(H, 32 if dtype == torch.bfloat16 else 16)
    options = dict(
        input_size=rng.randint(1, 12), num_layers=1 if dtype == torch.bfloat16 else rng.choice((1, 2)),
        bidirectional=rng.random() < 0.5,
        batch_first=rng.random() < 0.5, bias=rng.random() < 0.8, with_hx=rng.random() < 0.5,
        packed=rng.random() < 0.3,
    )
    lengths = None
    if options["packed"]:
        options["enforce_sorted"] = rng.random() < 0.5
        lengths = _draw_lengths(rng, T, B, least=1)
        if options["enforce_sorted"]:
            lengths.sort(reverse=True)
    layouts = {"input": _choose(rng, MODULE_INPUT_LAYOUTS)}
    if options["with_hx"]:
        layouts["hx"] = _choose(rng, MODULE_HX_LAYOUTS)
    return FuzzCase(seed, device, path, dtype, nonlinearity, T, B, H, lengths, layouts, options)


def _place(shape, dtype, device, layout, draw):
    """(view, buffer): a tensor of `shape` in `layout`, values from `draw(shape)`
    (CPU float64), in a NaN-filled buffer so that a read outside the view shows."""
    n = len(shape)
    buffer = lambda *s: torch.full(s, NAN, dtype=dtype, device=device)  # noqa: E731
    if layout == "contiguous":
        view = buf = buffer(*shape)
    elif layout == "misaligned":
        buf = buffer(math.prod(shape) + 1)
        view = buf[1:].view(shape)
    elif layout == "padded":  # unit last stride, longer rows, an odd offset
        buf = buffer(*(s + 1 for s in shape[:-1]), shape[-1] + 3)
        view = buf[(slice(1, None),) * (n - 1) + (slice(2, shape[-1] + 2),)]
    elif layout == "strided_batch":  # [T, B, H] from every other row of [T, 2B, H]
        buf = buffer(shape[0], 2 * shape[1], shape[2])
        view = buf[:, ::2]
    elif layout == "every_other":  # last stride 2
        buf = buffer(*shape[:-1], 2 * shape[-1])
        view = buf[..., ::2]
    elif layout in ("batch_first", "batch_swapped", "transposed"):  # the first two dims swapped in memory
        buf = buffer(shape[1], shape[0], *shape[2:])
        view = buf.transpose(0, 1)
    elif layout == "expanded":  # stride 0 but along the last dim
        buf = buffer(*(1,) * (n - 1), shape[-1])
        view = buf.expand(shape)
    elif layout == "expanded_all":  # every stride 0
        buf = buffer(*(1,) * n)
        view = buf.expand(shape)
    else:
        raise AssertionError(layout)
    target = buf if layout.startswith("expanded") else view
    target.copy_(draw(target.shape))
    return view, buf


def _like(t, layout):
    """A copy of `t` (3-D) in `layout`."""
    return _place(tuple(t.shape), t.dtype, t.device, layout, lambda s: t.detach().reshape(s))[0]


def _recurrent_weights(shape):
    """uniform(-1, 1) / sqrt(H), as nn.RNN draws them. Below H = 16 such a
    matrix has spectral radius >= 0.95 in a few percent of draws (up to 1.3):
    over 300 steps relu then grows past float16's range, and with a radius
    near 1 the rounding errors of a 16-bit state add up past 1e-2 even in a
    correct kernel. So small ones are scaled to a radius of at most 0.9."""
    w = (torch.rand(shape, dtype=torch.float64) * 2 - 1) * shape[0] ** -0.5
    if shape[0] <= 16:
        radius = torch.linalg.eigvals(w).abs().max().item()
        w *= min(1.0, 0.9 / max(radius, 1e-30))
    return w


def assert_within(out, ref, own, dtype, what, magnitudes=None):
    """out against the float64 ref, within the larger of TOL[dtype] and
    TORCH_ERROR_FACTOR times torch's own (`own`) error against it; with
    magnitudes (the sum of a sum's terms' magnitudes, as ref's shape), also
    within TOL of those (check_parity: why)."""
    bound = max(TOL[dtype], TORCH_ERROR_FACTOR * rel_err(own, ref))
    if magnitudes is not None:
        bound = max(bound, TOL[dtype] * (magnitudes.norm() / ref.norm().clamp_min(1e-300)).item())
    err = rel_err(out, ref)
    assert err < bound, f"{what}: relative error {err:.3g} >= {bound:.3g} (torch's own {rel_err(own, ref):.3g})"


def run_op_case(c):
    lay, T, B, H = c.layouts, c.T, c.B, c.H
    randn = lambda s: torch.randn(s, dtype=torch.float64)  # noqa: E731
    placed = {
        "xp": _place((T, B, H), c.dtype, c.device, lay["xp"], randn),
        "h0": _place((B, H), c.dtype, c.device, lay["h0"], lambda s: 0.5 * randn(s)),
        "w_hh": _place((H, H), c.dtype, c.device, lay["w_hh"], _recurrent_weights),
    }
    if "grad_y" in lay:
        placed["grad_y"] = _place((T, B, H), c.dtype, c.device, lay["grad_y"], randn)
    lengths = None
    if c.lengths is not None:
        lengths = torch.tensor(c.lengths)
        if lay["lengths"] == "strided":
            lengths = torch.stack([lengths, torch.full_like(lengths, -7)], 1).flatten()[::2]
    snapshots = {name: buf.clone() for name, (_, buf) in placed.items()}
    xp, h0, w = (placed[n][0] for n in ("xp", "h0", "w_hh"))
    poison_allocator(c.device, c.dtype, (T, B, H), (B, H), (H, H))
    grads = None
    if c.path == "forward":
        with torch.no_grad():
            y, h_n = forward(xp, h0, w, lengths, c.nonlinearity)
    elif c.path == "autograd":
        leaves = [t.detach().requires_grad_() for t in (xp, h0, w)]
        y, h_n = forward(*leaves, lengths, c.nonlinearity)
        grads = torch.autograd.grad(y, leaves, placed["grad_y"][0])
    else:
        y, h_n = forward(xp, h0, w, lengths, c.nonlinearity)
        y_arg = _like(y, lay["y"])
        grads = backward(placed["grad_y"][0], y_arg, h0, w, lengths, c.nonlinearity)
    sync(c.device)

    assert y.dtype == c.dtype and y.shape == (T, B, H) and y.is_contiguous(), "y: dtype, shape or layout"
    assert h_n.dtype == c.dtype and h_n.shape == (B, H) and h_n.is_contiguous(), "h_n: dtype, shape or layout"
    assert torch.equal(_bits(h_n), _bits(reference_final_state(y, h0, lengths))), "h_n: not y's final state"
    dead = None if lengths is None else (torch.arange(T).unsqueeze(1) >= lengths).to(c.device)
    if dead is not None:
        assert (y[dead] == 0).all(), "y: not zero past a length"
    ref_leaves = [t.detach().double().requires_grad_() for t in (xp, h0, w)]
    # act' from the op's y, as its backward takes it (conftest.reference_forward:
    # why); in float32 too, where a pre-activation within rounding of relu's
    # kink would otherwise flip one element's derivative
    given_y = y
    y_ref = reference_forward(*ref_leaves, lengths, c.nonlinearity, act_grad_from=given_y)
    # torch's own loop in the case's dtype (float32 for 16 bits, as the kernels compute)
    own_dtype = torch.float64 if c.dtype == torch.float64 else torch.float32
    own_leaves = [t.detach().to(own_dtype).requires_grad_() for t in (xp, h0, w)]
    y_own = reference_forward(*own_leaves, lengths, c.nonlinearity, act_grad_from=given_y, dtype=own_dtype)
    assert_within(y, y_ref, y_own, c.dtype, "y")
    if grads is not None:
        ref_grads = torch.autograd.grad(y_ref, ref_leaves, placed["grad_y"][0].double())
        own_grads = torch.autograd.grad(y_own, own_leaves, placed["grad_y"][0].to(own_dtype))
        # grad_w_hh = sum_t delta_t^T h_{t-1}, delta being grad_xp
        h_prev = torch.cat([ref_leaves[1].detach().unsqueeze(0), y_ref.detach()[:-1]])
        w_terms = torch.einsum("tbi,tbj->ij", ref_grads[0].abs(), h_prev.abs())
        for name, g, r, o, m in zip(("grad_xp", "grad_h0", "grad_w_hh"), grads, ref_grads, own_grads,
                                    (None, None, w_terms), strict=True):
            assert g.dtype == c.dtype and g.shape == r.shape, f"{name}: dtype or shape"
            assert_within(g, r, o, c.dtype, name, m)
        if dead is not None:
            assert (grads[0][dead] == 0).all(), "grad_xp: not zero past a length"
    for name, (_, buf) in placed.items():  # inputs, padding included, untouched
        assert torch.equal(_bits(buf), _bits(snapshots[name])), f"{name}: the op wrote into its input"


def term_magnitudes(reference, input, hx):
    """{parameter name: the sum over its gradient's terms of their magnitudes}
    for the float64 nn.RNN `reference` under check_parity's loss: a weight's
    gradient is sum_t delta_t v_t^T (v the layer's input or previous state,
    delta the pre-activation's gradient), a bias's sum_t delta_t; here
    sum_t |delta_t| |v_t|^T and sum_t |delta_t|, from a float64 loop over
    the layers, directions and steps whose gradients are checked against
    nn.RNN's."""
    D = 2 if reference.bidirectional else 1
    act = torch.tanh if reference.nonlinearity == "tanh" else torch.relu
    ref_input, ref_hx = as_reference(input), as_reference(hx)
    output, h_n, want = run(reference, ref_input, ref_hx)
    gen = torch.Generator().manual_seed(1)  # run()'s loss weights
    out_weights = torch.randn(output.data.shape, generator=gen).to(output.data)
    h_weights = torch.randn(h_n.shape, generator=gen).to(h_n)
    if isinstance(input, PackedSequence):
        x, lengths = pad_packed_sequence(ref_input)
        x = x.detach()
        out_weights = pad_packed_sequence(output._replace(data=out_weights))[0]
    else:
        x = ref_input.detach().transpose(0, 1) if reference.batch_first else ref_input.detach()
        out_weights = out_weights.transpose(0, 1) if reference.batch_first else out_weights
        lengths = torch.full((x.shape[1],), x.shape[0])
    T, B = x.shape[:2]
    live = (torch.arange(T).unsqueeze(1) < lengths.cpu()).unsqueeze(-1).to(x.device)  # [T, B, 1]
    params = {n: p.detach().clone().requires_grad_() for n, p in reference.named_parameters()}
    uses, finals, layer_input = [], [], x
    for layer in range(reference.num_layers):
        outputs = []
        for direction in range(D):
            suffix = f"_l{layer}" + ("_reverse" if direction else "")
            h = ref_hx.detach()[layer * D + direction] if ref_hx is not None else x.new_zeros(B, reference.hidden_size)
            ys = [None] * T
            for t in (reversed(range(T)) if direction else range(T)):
                z = layer_input[t] @ params["weight_ih" + suffix].T + h @ params["weight_hh" + suffix].T
                if reference.bias:
                    z = z + params["bias_ih" + suffix] + params["bias_hh" + suffix]
                z.retain_grad()
                uses.append((suffix, z, layer_input[t], h))
                h = torch.where(live[t], act(z), h)
                ys[t] = torch.where(live[t], h, 0)
            outputs.append(torch.stack(ys))
            finals.append(h)
        layer_input = torch.cat(outputs, -1)
    ((layer_input * out_weights).sum() + (torch.stack(finals) * h_weights).sum()).backward()
    magnitudes = {n: torch.zeros_like(p) for n, p in params.items()}
    for suffix, z, v, h in uses:
        delta = z.grad.abs()
        magnitudes["weight_ih" + suffix] += delta.T @ v.abs()
        magnitudes["weight_hh" + suffix] += delta.T @ h.detach().abs()
        if reference.bias:
            magnitudes["bias_ih" + suffix] += delta.sum(0)
            magnitudes["bias_hh" + suffix] += delta.sum(0)
    for (name, p), w in zip(params.items(), want[-len(params):], strict=True):  # float64 rounding, cancelled too
        bound = 1e-9 * max(1.0, (magnitudes[name].norm() / w.norm().clamp_min(1e-300)).item())
        assert rel_err(p.grad, w) < bound, f"term_magnitudes: the loop's grad {name} is not nn.RNN's"
    return magnitudes


def run_module_case(c):
    m = c.module
    D = 2 if m["bidirectional"] else 1
    ours = torch_prnn.PersistentRNN(
        m["input_size"], c.H, m["num_layers"], c.nonlinearity, m["bias"], m["batch_first"],
        bidirectional=m["bidirectional"], device=c.device, dtype=c.dtype,
    )
    reference = float64_twin(ours, c.device)
    shape = (c.B, c.T, m["input_size"]) if m["batch_first"] else (c.T, c.B, m["input_size"])
    randn = lambda s: torch.randn(s, dtype=torch.float64)  # noqa: E731
    x = _place(shape, c.dtype, c.device, c.layouts["input"], randn)[0].detach().requires_grad_()
    input = x
    if m["packed"]:
        input = pack_padded_sequence(
            x, torch.tensor(c.lengths), batch_first=m["batch_first"], enforce_sorted=m["enforce_sorted"]
        )
    hx = None
    if m["with_hx"]:
        hx_shape = (m["num_layers"] * D, c.B, c.H)
        hx = _place(hx_shape, c.dtype, c.device, c.layouts["hx"], lambda s: 0.5 * randn(s))[0]
        hx = hx.detach().requires_grad_()
    # output, h_n, every gradient; in float32 within TORCH_ERROR_FACTOR of
    # nn.RNN's own error too; a parameter's gradient also within TOL of its
    # terms' magnitudes
    check_parity(ours, reference, input, hx, c.dtype, TORCH_ERROR_FACTOR if c.dtype == torch.float32 else None,
                 term_magnitudes(reference, input, hx))
    sync(c.device)


def run_case(case):
    torch.manual_seed(case.seed)
    (run_module_case if case.path == "module" else run_op_case)(case)


@pytest.mark.parametrize("steps,batch", [(1, 1), (7, 3)])
def test_term_magnitudes_bound_the_gradients(steps, batch):
    """Each parameter gradient is at most its terms' magnitudes, element by
    element, and equal to them in absolute value where a gradient has one
    term (one step of one sequence): there the fuzz's relaxed bound is TOL."""
    torch.manual_seed(steps)
    ours = torch_prnn.PersistentRNN(3, 4, num_layers=2, bidirectional=True, dtype=torch.float64)
    reference = float64_twin(ours)
    x = torch.randn(steps, batch, 3, dtype=torch.float64, requires_grad=True)
    magnitudes = term_magnitudes(reference, x, None)
    grads = run(reference, as_reference(x), None)[2][-len(magnitudes):]
    for (name, m), g in zip(magnitudes.items(), grads, strict=True):
        assert (m >= g.abs() - 1e-12).all(), name
        if steps == 1 and batch == 1:
            assert torch.allclose(m, g.abs(), rtol=1e-12, atol=0), name


# The hang guard: the budget, and room for a slow case after it.
@pytest.mark.hang_guard(float(os.environ.get("PRNN_FUZZ_SECONDS", "20")) + 300)
@pytest.mark.parametrize("device", DEVICES)
def test_fuzz(device, record_property):
    """Random problems against the float64 reference within a wall-time budget;
    each case is reproducible from its printed seed. The count also goes to
    the junit XML (`fuzz_cases`), where a passing run keeps it."""
    budget = float(os.environ.get("PRNN_FUZZ_SECONDS", "20" if device == "cuda" else "8"))
    replay = os.environ.get("PRNN_FUZZ_REPLAY")
    seeds = [int(replay)] if replay else range(FUZZ_SEED, FUZZ_SEED + FUZZ_CASES)
    start, ran = time.monotonic(), 0
    for seed in seeds:
        if ran and time.monotonic() - start > budget:
            break
        case = draw_case(seed, device)
        print(f"fuzz seed={seed}: {case}")
        try:
            run_case(case)
        except Exception as error:  # noqa: BLE001 - reported with the seed
            raise AssertionError(
                f"fuzz case failed: seed={seed}: {case}\n  {type(error).__name__}: {error}\n"
                f"  replay: PRNN_FUZZ_REPLAY={seed} python -m pytest -s "
                f"tests/test_reliability.py -k 'fuzz and {device}'"
            ) from error
        ran += 1
    record_property("fuzz_cases", ran)
    print(
        f"fuzz[{device}]: {ran} cases passed in {time.monotonic() - start:.1f} s "
        f"(seeds {seeds[0]}..{seeds[0] + ran - 1}; PRNN_FUZZ_SECONDS={budget:g}, PRNN_FUZZ_CASES={FUZZ_CASES})"
    )
    assert ran >= 1


# ---- 3. concurrency: an inference server -------------------------------------


@needs_cuda
@pytest.mark.hang_guard(300)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_name)
def test_inference_server_threads(dtype):
    """One PersistentRNN (eval, no_grad) serving 8 Python threads at once, each
    with its own requests of varying batch size (1-12: both sides of the grid
    tier's large-batch tiling where the cluster tier is off) and length, half of the threads on their own stream;
    50 calls each, every result against the float64 nn.RNN."""
    threads_n, calls, I, H = 8, 50, 16, 256
    ours = torch_prnn.PersistentRNN(I, H, num_layers=2, bidirectional=True, device="cuda", dtype=dtype).eval()
    reference = float64_twin(ours, "cuda")
    gen = torch.Generator().manual_seed(0)
    requests = []
    for i in range(threads_n):
        mine = []
        for j in range(calls):
            T, B = 1 + (13 * i + 5 * j) % 40, 1 + (7 * i + 3 * j) % 12
            x = torch.randn(T, B, I, generator=gen).to("cuda", dtype)
            hx = (0.5 * torch.randn(4, B, H, generator=gen)).to("cuda", dtype) if j % 3 == 0 else None
            mine.append((x, hx))
        requests.append(mine)
    with torch.no_grad():
        expected = [[reference(x.double(), None if h is None else h.double()) for x, h in r] for r in requests]
    torch.cuda.synchronize()
    results = [[None] * calls for _ in range(threads_n)]
    start = threading.Barrier(threads_n)

    def serve(i):
        stream = torch.cuda.Stream() if i % 2 == 0 else None  # None: the default stream
        with torch.no_grad(), torch.cuda.stream(stream):  # grad mode is per thread
            start.wait(timeout=60)
            for j, (x, hx) in enumerate(requests[i]):
                results[i][j] = ours(x, hx)
            torch.cuda.current_stream().synchronize()

    run_threads(serve, [(i,) for i in range(threads_n)], timeout=240)
    torch.cuda.synchronize()
    for i in range(threads_n):
        for j in range(calls):
            (out, h_n), (ref_out, ref_h) = results[i][j], expected[i][j]
            assert out.dtype == dtype and out.shape == ref_out.shape
            assert_close(out, ref_out, dtype, f"thread {i}, call {j}: output")
            assert_close(h_n, ref_h, dtype, f"thread {i}, call {j}: h_n")


# ---- 4. determinism ---------------------------------------------------------


@pytest.mark.parametrize(
    "device,dtype",
    _device_dtypes([torch.float32, torch.float64], [torch.float32, torch.bfloat16, torch.float16]),
)
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("B", [3, 12])
def test_module_bitwise_deterministic(device, dtype, packed, B):
    """Forward and backward of a 2-layer bidirectional module twice on the same
    inputs, with another problem on the same module in between: output, h_n
    and the gradients of input, hx and every parameter bitwise equal.
    (B = 12 takes the grid tier's large-batch tiles on CUDA where the cluster
    tier is off.)"""
    T, I, H = (40, 8, 256) if device == "cuda" else (12, 8, 32)
    rnn = torch_prnn.PersistentRNN(I, H, num_layers=2, bidirectional=True, device=device, dtype=dtype)
    x = torch.randn(T, B, I, device=device).to(dtype)
    hx = (0.5 * torch.randn(4, B, H, device=device)).to(dtype)
    lengths = torch.randint(1, T + 1, (B,))
    lengths[0] = T
    g_h = torch.randn(4, B, H, device=device).to(dtype)
    g_out = torch.randn(int(lengths.sum()) if packed else T, *(() if packed else (B,)), 2 * H, device=device)
    g_out = g_out.to(dtype)

    def once():
        x_, hx_ = x.clone().requires_grad_(), hx.clone().requires_grad_()
        input = pack_padded_sequence(x_, lengths, enforce_sorted=False) if packed else x_
        out, h_n = rnn(input, hx_)
        out = out.data if packed else out
        grads = torch.autograd.grad((out, h_n), [x_, hx_, *rnn.parameters()], (g_out, g_h))
        return [out.detach(), h_n.detach(), *grads]

    first = once()
    with torch.no_grad():  # a different problem in between: no state may carry over
        rnn(torch.randn(7, B + 5, I, device=device).to(dtype))
    second = once()
    sync(device)
    names = ["output", "h_n", "grad input", "grad hx"] + [f"grad {n}" for n, _ in rnn.named_parameters()]
    for name, a, b in zip(names, first, second, strict=True):
        assert a.isfinite().all(), f"{name}: non-finite values"
        assert torch.equal(a, b), f"{name}: differs between two identical runs, by up to {(a - b).abs().max()}"
