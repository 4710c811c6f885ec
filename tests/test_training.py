"""Training with PersistentRNN as users run it: a few hundred optimizer steps
in step with the same model on nn.RNN; torch.compile of a whole training step
(fullgraph forward and loss, its compiled backward, a compiled optimizer step)
and of forward and backward in CUDA graphs (mode="reduce-overhead"); autocast;
float64 gradcheck on every device; non-contiguous upstream gradients."""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch.nn.utils.rnn import pack_padded_sequence

import torch_prnn
from conftest import TOL, assert_close, devices, make_op_inputs, needs_cuda, reference_forward, rel_err, twins

forward = torch.ops.prnn.forward


def dtype_id(value):
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else None


@pytest.fixture
def true_fp32():
    """float32 everywhere, also in nn.RNN's cuDNN kernels and cuBLAS (TF32 off)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# ---- the task: the running sum of +1/-1/0 steps, read off a bidirectional stack


VOCAB, EMBED, HIDDEN, STEPS, BATCH = 4, 16, 32, 24, 8
STEP_OF_TOKEN = torch.tensor([1.0, -1.0, 0.0, 0.0])  # tokens 2 and 3 are both "stay"


class RunningSum(nn.Module):
    """Embedding -> 2-layer bidirectional RNN -> Linear: one number per step."""

    def __init__(self, rnn: nn.Module):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, EMBED)
        self.rnn = rnn
        self.head = nn.Linear(2 * HIDDEN, 1)

    def forward(self, tokens):
        y, _ = self.rnn(self.embed(tokens))
        return self.head(y).squeeze(-1)


def make_models(device, batch_first):
    """The model on PersistentRNN and its twin on nn.RNN with the same weights."""
    kwargs = dict(num_layers=2, bidirectional=True, batch_first=batch_first, device=device)
    torch.manual_seed(0)
    ours = RunningSum(torch_prnn.PersistentRNN(EMBED, HIDDEN, **kwargs)).to(device)
    theirs = RunningSum(nn.RNN(EMBED, HIDDEN, **kwargs)).to(device)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def batches(batch_first, device, seed=0):
    """Endless (tokens, running sum / 4) from a fixed CPU generator, so every
    model and device sees the same data."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        tokens = torch.randint(0, VOCAB, (BATCH, STEPS), generator=gen)
        target = STEP_OF_TOKEN[tokens].cumsum(1) / 4
        if not batch_first:
            tokens, target = tokens.t(), target.t()
        yield tokens.to(device), target.to(device)


def loss_of(model, tokens, target):
    return F.mse_loss(model(tokens), target)


def train(model, optimizer, data, steps):
    losses = []
    for _ in range(steps):
        loss = loss_of(model, *next(data))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return torch.tensor(losses, dtype=torch.float64)


# ---- 1. end-to-end training parity with nn.RNN


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("batch_first", [False, True])
def test_training_matches_nn_rnn(device, batch_first, true_fp32):
    """Adam on the same data from the same weights: the loss curves agree step
    by step and the final parameters are close.

    Bound: the two runs differ only by float32 rounding (summation order in
    the recurrence and its GEMMs), which training then carries forward. On the
    CPU over 200 steps the per-step loss differs by at most 2.1e-5 relative
    (parameters 4e-7), and nn.RNN against itself with 1e-6 relative noise on
    every gradient element at every step (about ten times float32's rounding)
    by at most 1.3e-4 (parameters 2e-6): so 1e-3 relative keeps a 7x margin
    over a pessimistic model of the noise, and still catches a wrong gradient
    (dropping the last step's input gradient, or adding 1e-3 W_hh^T to W_hh's,
    fails it)."""
    steps = 200 if device == "cuda" else 120
    ours, theirs = make_models(device, batch_first)
    losses = []
    threads = torch.get_num_threads()
    if device == "cpu":  # tiny GEMMs: one thread is as fast, and immune to a busy machine
        torch.set_num_threads(1)
    try:
        for model in (ours, theirs):
            optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
            losses.append(train(model, optimizer, batches(batch_first, device), steps))
    finally:
        torch.set_num_threads(threads)
    mine, reference = losses

    assert torch.isfinite(mine).all()
    # Meaningful: the model learns the task (loss 0.32 -> 0.016 in 120 steps on the CPU).
    assert reference[-10:].mean() < 0.25 * reference[:10].mean(), reference
    deviation = (mine - reference).abs()
    worst = int(deviation.argmax())
    assert (deviation <= 1e-3 * reference + 1e-6).all(), (
        f"step {worst}: loss {mine[worst]:.8f} against nn.RNN's {reference[worst]:.8f}"
    )
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        err = rel_err(a, b)  # observed: below 1e-6 on the CPU
        assert err < 1e-4, f"{name}: relative difference {err:.3g} after {steps} steps"


# ---- 2. torch.compile of a training step


def assert_same_training(compiled_losses, eager_losses, compiled_model, eager_model, fixed_batch):
    compiled_losses, eager_losses = torch.stack(compiled_losses), torch.stack(eager_losses)
    torch.testing.assert_close(compiled_losses, eager_losses, rtol=1e-5, atol=1e-7)
    if fixed_batch:  # it trained
        assert eager_losses[-1] < 0.9 * eager_losses[0], eager_losses
    for (name, a), (_, b) in zip(
        compiled_model.named_parameters(), eager_model.named_parameters(), strict=True
    ):
        assert_close(a, b, torch.float32, name)


@pytest.mark.parametrize("device", devices)
def test_compiled_training_step(device, true_fp32, fresh_dynamo):
    """Forward and loss under torch.compile(fullgraph=True) (AOTAutograd
    compiles the backward with it), loss.backward() through the compiled
    graph, and the optimizer step compiled as PyTorch's recipe does it
    (fullgraph=False: Optimizer.step breaks the graph on purpose around its
    no_grad region). Five steps match eager training within float32 rounding."""
    model, _ = make_models(device, batch_first=True)
    eager = copy.deepcopy(model)
    counter = CompileCounterWithBackend("inductor")
    compiled_loss = torch.compile(loss_of, fullgraph=True, backend=counter)
    # SGD with momentum: Adam's first steps are lr * sign(grad), which turns
    # rounding-level differences of near-zero gradient elements into full steps.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)

    @torch.compile(fullgraph=False)
    def optimizer_step():
        optimizer.step()

    batch = next(batches(True, device))  # one batch: the loss must fall
    compiled_losses, eager_losses = [], []
    for step in range(5):
        loss = compiled_loss(model, *batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        expected = loss_of(eager, *batch)
        eager_optimizer.zero_grad(set_to_none=True)
        expected.backward()
        if step == 0:  # the compiled backward's gradients, before any update
            for (name, p), (_, q) in zip(model.named_parameters(), eager.named_parameters()):
                assert_close(p.grad, q.grad, torch.float32, f"grad {name}")
        optimizer_step()
        eager_optimizer.step()
        compiled_losses.append(loss.detach())
        eager_losses.append(expected.detach())
    assert counter.frame_count == 1  # one graph, no recompiles
    assert_same_training(compiled_losses, eager_losses, model, eager, fixed_batch=True)


@needs_cuda
def test_reduce_overhead_training(true_fp32, fresh_dynamo):
    """mode="reduce-overhead": forward+loss and its backward run as CUDA graphs
    (cudagraph trees); the eager optimizer steps in between. Padded tensors
    only: packed input copies lengths from the host, which a graph cannot replay."""
    from torch._dynamo.utils import counters

    counters.clear()
    model, _ = make_models("cuda", batch_first=True)
    eager = copy.deepcopy(model)
    compiled_loss = torch.compile(loss_of, mode="reduce-overhead", fullgraph=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    data = batches(True, "cuda")
    compiled_losses, eager_losses = [], []
    for _ in range(6):  # warm-up run, recording, then replays
        # Fresh tensors each step (copied into the graph's static inputs), same values.
        tokens, target = next(data)
        torch.compiler.cudagraph_mark_step_begin()
        loss = compiled_loss(model, tokens, target)
        loss.backward()
        optimizer.step()
        # The gradients live in the graphs' memory pool, which the next replay
        # overwrites: drop them, and keep a copy of the loss.
        optimizer.zero_grad(set_to_none=True)
        compiled_losses.append(loss.detach().clone())
        expected = loss_of(eager, tokens, target)
        eager_optimizer.zero_grad(set_to_none=True)
        expected.backward()
        eager_optimizer.step()
        eager_losses.append(expected.detach())
    assert counters["inductor"]["cudagraph_skips"] == 0, "inductor did not use CUDA graphs"
    assert_same_training(compiled_losses, eager_losses, model, eager, fixed_batch=False)


# ---- 3. autocast


class Regressor(nn.Module):
    """Linear -> 2-layer RNN -> Linear, batch first."""

    def __init__(self, rnn: nn.Module):
        super().__init__()
        self.inp = nn.Linear(5, 16)
        self.rnn = rnn
        self.head = nn.Linear(24, 1)

    def forward(self, x):
        y, h_n = self.rnn(self.inp(x))
        return self.head(y).squeeze(-1), y, h_n


def regressors(device):
    """PersistentRNN float32, nn.RNN float32 and nn.RNN float64, same weights."""
    kwargs = dict(input_size=16, hidden_size=24, num_layers=2, batch_first=True, device=device)
    torch.manual_seed(0)
    ours = Regressor(torch_prnn.PersistentRNN(**kwargs)).to(device)
    theirs = Regressor(nn.RNN(**kwargs)).to(device)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs, copy.deepcopy(theirs).double()


AUTOCAST = [("cpu", torch.bfloat16)] + (
    [("cuda", torch.bfloat16), ("cuda", torch.float16)] if torch.cuda.is_available() else []
)


@pytest.mark.parametrize("device,dtype", AUTOCAST, ids=dtype_id)
def test_autocast_training(device, dtype):
    ours, theirs, reference = regressors(device)
    x = torch.randn(4, 24, 5, device=device)
    target = torch.randn(4, 24, device=device).cumsum(1) / 5
    with torch.autocast(device, dtype=dtype):
        pred, y, h_n = ours(x)
        try:
            their_y, their_h = theirs(x)[1:]
        except RuntimeError:  # nn.RNN without autocast support here: the policy alone
            assert device != "cpu"
            their_y = their_h = y
    # The op's autocast rule (ops.py): run in the autocast dtype...
    assert pred.dtype == y.dtype == h_n.dtype == dtype
    # ...which is nn.RNN's on the CPU. On CUDA, cuDNN's autocast wrapper for
    # _cudnn_rnn (ATen/cudnn/AutocastRNN.cpp) casts to float16 whatever the
    # autocast dtype; torch_prnn keeps bfloat16 there (said, not failed).
    if device == "cpu" or their_y.dtype == dtype:
        assert their_y.dtype == y.dtype and their_h.dtype == h_n.dtype
    else:
        assert dtype == torch.bfloat16 and their_y.dtype == torch.float16, their_y.dtype
        warnings.warn(
            f"under autocast({dtype}) nn.RNN on cuDNN gives {their_y.dtype}, PersistentRNN {y.dtype}"
        )

    # Values: within the reduced-precision bound of a float64 reference.
    # Observed on the CPU (bfloat16): output and h_n 4e-3 (nn.RNN 5e-3).
    with torch.no_grad():
        ref_pred, ref_y, ref_h = reference(x.double())
    assert_close(y, ref_y, dtype, "output")
    assert_close(h_n, ref_h, dtype, "h_n")
    # The head adds a GEMM in the autocast dtype and another rounding: 8e-3
    # observed, nn.RNN's own 1.1e-2 under the same autocast.
    err = rel_err(pred, ref_pred)
    assert err < 2 * TOL[dtype], f"prediction: relative error {err:.3g}"

    # Backward outside the autocast region, as recommended: float32 gradients
    # of float32 parameters, close to the float64 ones.
    loss = F.mse_loss(pred.float(), target)
    loss.backward()
    ref_loss = F.mse_loss(reference(x.double())[0], target.double())
    ref_loss.backward()
    for (name, p), (_, q) in zip(ours.named_parameters(), reference.named_parameters(), strict=True):
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32, name
        assert torch.isfinite(p.grad).all(), name
        err = rel_err(p.grad, q.grad)  # observed on the CPU, bfloat16: below 1e-2
        assert err < 5 * TOL[dtype], f"grad {name}: relative error {err:.3g}"

    # A few steps of mixed-precision training reduce the loss.
    optimizer = torch.optim.Adam(ours.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        with torch.autocast(device, dtype=dtype):
            loss = F.mse_loss(ours(x)[0].float(), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(p.dtype == torch.float32 for p in ours.parameters())
    assert losses[-1] < 0.5 * losses[0], losses


# ---- 4. gradcheck in float64, every device


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("with_lengths", [False, True])
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_gradcheck_op(device, with_lengths, nonlinearity):
    xp, h0, w = make_op_inputs(4, 3, 5, torch.float64, device, requires_grad=True)
    lengths = torch.tensor([4, 1, 3]) if with_lengths else None  # a CPU tensor on every device
    assert torch.autograd.gradcheck(lambda *a: forward(*a, lengths, nonlinearity), (xp, h0, w))


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_gradcheck_module(device, nonlinearity):
    rnn = torch_prnn.PersistentRNN(
        3, 4, num_layers=2, bidirectional=True, nonlinearity=nonlinearity,
        device=device, dtype=torch.float64,
    )
    x = torch.randn(4, 2, 3, dtype=torch.float64, device=device, requires_grad=True)
    hx = torch.randn(4, 2, 4, dtype=torch.float64, device=device, requires_grad=True)
    w = rnn.weight_hh_l1_reverse
    params = dict(rnn.named_parameters())

    def f(x, hx, w):
        return torch.func.functional_call(rnn, {**params, "weight_hh_l1_reverse": w}, (x, hx))

    assert torch.autograd.gradcheck(f, (x, hx, w))
    lengths = torch.tensor([4, 2])
    packed = lambda x, hx, w: f(pack_padded_sequence(x, lengths), hx, w)[0].data  # noqa: E731
    assert torch.autograd.gradcheck(packed, (x, hx, w))


# ---- 5. non-contiguous upstream gradients


GRAD_KINDS = ["slice", "permuted", "expanded", "sum"]
REDUCED = [torch.float16, torch.bfloat16]


def strided_grad(kind, shape, dtype, device):
    """A gradient of `shape` that is not contiguous: a strided slice of a
    larger buffer, a permuted tensor (the last dimension not unit-stride), or
    an expansion with stride 0 along the first dimension."""
    a, b, c = shape
    if kind == "slice":
        g = torch.randn(a + 2, 2 * b, c + 5, dtype=dtype, device=device)[1 : a + 1, ::2, 2 : c + 2]
    elif kind == "permuted":
        g = torch.randn(c, b, a, dtype=dtype, device=device).permute(2, 1, 0)
    else:
        g = torch.randn(1, b, c, dtype=dtype, device=device).expand(a, b, c)
    assert g.shape == shape and not g.is_contiguous()
    return g


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", [torch.float32] + REDUCED, ids=dtype_id)
@pytest.mark.parametrize("kind", GRAD_KINDS)
@pytest.mark.parametrize("with_lengths", [False, True])
def test_op_non_contiguous_grad(device, dtype, kind, with_lengths):
    T, B, H = 16, 3, 33
    xp, h0, w = make_op_inputs(T, B, H, dtype, device, requires_grad=True)
    lengths = torch.tensor([T, 5, 11]) if with_lengths else None
    leaves = [t.detach().double().requires_grad_() for t in (xp, h0, w)]
    y, _ = forward(xp, h0, w, lengths, "tanh")
    y_ref = reference_forward(*leaves, lengths, "tanh")
    if kind == "sum":  # autograd hands the op an all-ones stride-0 gradient
        grads = torch.autograd.grad(y.sum(), (xp, h0, w))
        grads_ref = torch.autograd.grad(y_ref.sum(), leaves)
    else:
        grad_y = strided_grad(kind, y.shape, dtype, device)
        grads = torch.autograd.grad(y, (xp, h0, w), grad_y)
        grads_ref = torch.autograd.grad(y_ref, leaves, grad_y.double())
    for name, g, g_ref in zip(("xp", "h0", "w_hh"), grads, grads_ref, strict=True):
        assert g.dtype == dtype and g.shape == g_ref.shape
        assert_close(g, g_ref, dtype, f"grad {name} ({kind} grad_y)")


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("dtype", [torch.float32] + REDUCED, ids=dtype_id)
@pytest.mark.parametrize("kind", GRAD_KINDS)
@pytest.mark.parametrize("batch_first", [False, True])
def test_module_non_contiguous_grad(device, dtype, kind, batch_first):
    ours, reference = twins(
        device, dtype, input_size=5, hidden_size=33, num_layers=2,
        bidirectional=True, batch_first=batch_first,
    )
    shape = (3, 16, 5) if batch_first else (16, 3, 5)
    x = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    x_ref = x.detach().double().requires_grad_()
    output, h_n = ours(x)
    ref_output, ref_h_n = reference(x_ref)
    inputs, ref_inputs = [x, *ours.parameters()], [x_ref, *reference.parameters()]
    if kind == "sum":  # stride-0 gradients from autograd; dense ones for nn.RNN
        grads = torch.autograd.grad(output.sum() + h_n.sum(), inputs)
        ones = (torch.ones_like(ref_output), torch.ones_like(ref_h_n))
        grads_ref = torch.autograd.grad((ref_output, ref_h_n), ref_inputs, ones)
    else:
        g_out = strided_grad(kind, output.shape, dtype, device)
        g_h = strided_grad(kind, h_n.shape, dtype, device)
        grads = torch.autograd.grad((output, h_n), inputs, (g_out, g_h))
        # Contiguous float64 copies for nn.RNN (cuDNN wants dense gradients).
        dense = [g.double().contiguous() for g in (g_out, g_h)]
        grads_ref = torch.autograd.grad((ref_output, ref_h_n), ref_inputs, dense)
    names = ["input"] + [n for n, _ in ours.named_parameters()]
    for name, g, g_ref in zip(names, grads, grads_ref, strict=True):
        assert g.dtype == dtype and g.shape == g_ref.shape
        assert_close(g, g_ref, dtype, f"grad {name} ({kind} grad_output)")
