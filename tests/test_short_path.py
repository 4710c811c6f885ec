"""The short path of the modules' forward (torch_prnn/_short.py: an eager call
on tensor input of a one-direction module runs all its layers in
prnn::layers) against the regular path and against nn's modules: the same
outputs, final states and gradients bit for bit, also after the parameters
change; the same ops seen by a dispatch mode; the same errors for bad input;
and torch.compile, torch.export, TorchScript, tracing and torch.func keep
the regular path."""

import contextlib

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import torch_prnn
from conftest import Batched, devices, needs_cuda
from torch_prnn import _short

I, H, P = 5, 7, 4
# name: (constructor keywords, torch_prnn class, nn class)
CELLS = {
    "rnn": ({}, torch_prnn.PersistentRNN, nn.RNN),
    "rnn_relu": ({"nonlinearity": "relu"}, torch_prnn.PersistentRNN, nn.RNN),
    "lstm": ({}, torch_prnn.PersistentLSTM, nn.LSTM),
    "lstm_proj": ({"proj_size": P}, torch_prnn.PersistentLSTM, nn.LSTM),
    "gru": ({}, torch_prnn.PersistentGRU, nn.GRU),
}
# (num_layers, bias, batch_first)
SHAPES = [(1, True, False), (2, False, True), (3, True, False)]


def make(cell, device="cpu", dtype=torch.float32, num_layers=1, bias=True, batch_first=False, **extra):
    kwargs, ours, _ = CELLS[cell]
    return ours(I, H, num_layers=num_layers, bias=bias, batch_first=batch_first, device=device, dtype=dtype,
                **kwargs, **extra)


def nn_twin(cell, module):
    """nn's module for `module` of `cell`: its configuration and a copy of its weights."""
    kwargs, _, theirs = CELLS[cell]
    weight = module.weight_ih_l0
    twin = theirs(I, H, num_layers=module.num_layers, bias=module.bias, batch_first=module.batch_first,
                  device=weight.device, dtype=weight.dtype, **kwargs)
    twin.load_state_dict(module.state_dict())
    return twin


def make_call(module, batched, with_hx, steps=3, batch=2, requires_grad=False):
    """(input, hx) for a call of `module` (hx None without with_hx)."""
    weight = module.weight_ih_l0
    options = {"device": weight.device, "dtype": weight.dtype}
    lead = ((batch, steps) if module.batch_first else (steps, batch)) if batched else (steps,)
    x = torch.randn(*lead, I, **options).requires_grad_(requires_grad)
    if not with_hx:
        return x, None
    sizes = [module.proj_size or H] + ([H] if isinstance(module, torch_prnn.PersistentLSTM) else [])
    states = [torch.randn(module.num_layers, *([batch] if batched else []), size, **options) for size in sizes]
    return x, as_hx([state.requires_grad_(requires_grad) for state in states])


def as_hx(states):
    """A list of states as forward takes them: LSTM's (h, c), the others' h."""
    return tuple(states) if len(states) == 2 else states[0]


def flat(hx):
    return [] if hx is None else list(hx) if isinstance(hx, tuple) else [hx]


def outputs_and_grads(module, x, hx):
    """[output, *final states], then with autograd the gradients of a loss of
    them all for the input, hx's states and the parameters."""
    output, h_n = module(x, hx)
    values = [output] + flat(h_n)
    if not torch.is_grad_enabled():
        return values
    loss = sum((v * torch.linspace(-1, 1, v.numel(), dtype=v.dtype, device=v.device).view_as(v)).sum() for v in values)
    leaves = [x] + flat(hx) + list(module.parameters())
    return values + list(torch.autograd.grad(loss, leaves))


def assert_identical(got, expected):
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert a.shape == b.shape and a.dtype == b.dtype, i
        assert torch.equal(a, b), f"tensor {i} differs by {(a - b).abs().max().item()}"


@pytest.fixture
def counted(monkeypatch):
    """The number of prnn::layers calls so far: calls["n"]."""
    calls = {"n": 0}
    layers = _short._layers

    def counting(*args):
        calls["n"] += 1
        return layers(*args)

    monkeypatch.setattr(_short, "_layers", counting)
    return calls


@contextlib.contextmanager
def regular_path():
    """forward takes the regular path inside (as it does under a __torch_function__ mode)."""
    applies = _short.applies
    _short.applies = lambda module, input: False
    try:
        yield
    finally:
        _short.applies = applies


def both_paths(module, x, hx, counted):
    """outputs_and_grads by the short path (checked to be taken) and by the regular path."""
    before = counted["n"]
    short = outputs_and_grads(module, x, hx)
    assert counted["n"] == before + 1, "the call did not take the short path"
    with regular_path():
        regular = outputs_and_grads(module, x, hx)
    assert counted["n"] == before + 1
    return short, regular


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("with_hx", [True, False], ids=["hx", "no_hx"])
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "L{}-bias{}-bf{}".format(*s))
@pytest.mark.parametrize("cell", CELLS)
def test_matches_regular_path(cell, shape, batched, with_hx, device, counted):
    """Outputs, final states and every gradient, bit for bit: with and
    without autograd, and the no-grad call against the grad-enabled one."""
    num_layers, bias, batch_first = shape
    module = make(cell, device, num_layers=num_layers, bias=bias, batch_first=batch_first)
    x, hx = make_call(module, batched, with_hx, requires_grad=True)
    short, regular = both_paths(module, x, hx, counted)
    assert_identical(short, regular)
    with torch.no_grad():
        short_no_grad, regular_no_grad = both_paths(module, x, hx, counted)
    assert_identical(short_no_grad, regular_no_grad)
    assert_identical(short_no_grad, short[: len(short_no_grad)])


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("with_hx", [True, False], ids=["hx", "no_hx"])
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
@pytest.mark.parametrize("cell", CELLS)
def test_matches_nn(cell, batched, with_hx, device, counted):
    """The short path against nn's module with the same weights, in float64;
    one timestep a call, the state carried, as a server steps a model."""
    module = make(cell, device, torch.float64, num_layers=2)
    twin = nn_twin(cell, module)
    x, hx = make_call(module, batched, with_hx, steps=1)
    expected_hx = hx
    with torch.no_grad():
        for _ in range(3):
            output, hx = module(x, hx)
            expected, expected_hx = twin(x, expected_hx)
            for got, want in zip([output] + flat(hx), [expected] + flat(expected_hx), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert counted["n"] == 3


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("cell", CELLS)
def test_follows_parameter_changes(cell, device, counted):
    """What the short path reads is the module's parameters of the moment:
    after an in-place change, after module.to(dtype), after assigning a new
    Parameter, and under torch.func.functional_call."""
    module = make(cell, device, num_layers=2)

    def check(x, hx):
        assert_identical(*both_paths(module, x, hx, counted))
        # cuDNN's float32 without TF32, which it would use by default
        with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            torch.testing.assert_close(module(x, hx)[0], nn_twin(cell, module)(x, hx)[0])

    x, hx = make_call(module, True, True, requires_grad=True)
    check(x, hx)
    with torch.no_grad():
        module.weight_hh_l0.mul_(0.5)
        module.weight_ih_l1.add_(0.25)
    check(x, hx)

    module.to(torch.float64)
    x = x.detach().double().requires_grad_()
    hx = as_hx([state.detach().double().requires_grad_() for state in flat(hx)])
    check(x, hx)
    module.weight_hh_l1 = nn.Parameter(torch.randn_like(module.weight_hh_l1))
    check(x, hx)

    replaced = {name: torch.randn_like(p) for name, p in module.named_parameters()}
    with torch.no_grad():
        before = counted["n"]
        got = torch.func.functional_call(module, replaced, (x, hx))
        assert counted["n"] == before + 1
        with regular_path():
            expected = torch.func.functional_call(module, replaced, (x, hx))
        assert_identical([got[0]] + flat(got[1]), [expected[0]] + flat(expected[1]))
        assert not torch.equal(got[0], module(x, hx)[0])  # the module's own weights again


@pytest.mark.parametrize("cell", CELLS)
def test_dropout_in_training(cell, counted):
    """In training mode the dropout between layers draws the same masks from the same seed."""
    module = make(cell, num_layers=3, dropout=0.5).train()
    x, hx = make_call(module, True, True, requires_grad=True)
    torch.manual_seed(3)
    short = outputs_and_grads(module, x, hx)
    torch.manual_seed(3)
    with regular_path():
        regular = outputs_and_grads(module, x, hx)
    assert_identical(short, regular)
    assert counted["n"] == 1
    assert not torch.equal(short[0], module.eval()(x, hx)[0])


class OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shapes = [tuple(t.shape) for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.ops.append((str(func), shapes))
        return out


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("with_hx", [True, False], ids=["hx", "no_hx"])
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
@pytest.mark.parametrize("cell", CELLS)
def test_dispatch_mode_sees_the_regular_ops(cell, batched, with_hx, grad, counted):
    """A dispatch mode (as profilers and tracers use) sees the ops of the
    regular path, in its order: prnn::layers itself decomposes above it."""
    module = make(cell, num_layers=2, batch_first=True)
    x, hx = make_call(module, batched, with_hx, requires_grad=grad)
    logs = []
    for path in (contextlib.nullcontext, regular_path):
        with path(), torch.set_grad_enabled(grad), OpLog() as log:
            module(x, hx)
        logs.append(log.ops)
    assert counted["n"] == 1
    assert logs[0] == logs[1] and any("prnn." in op for op, _ in logs[0])


def error_of(call):
    try:
        call()
    except Exception as error:  # noqa: BLE001  (any error: compared below)
        return type(error), str(error)
    return None


# name: (cell, module keywords, input, hx) of a call that forward refuses.
BAD_CALLS = {
    "input size": ("rnn", {}, lambda: torch.randn(3, 2, I + 1), None),
    "input dtype": ("gru", {}, lambda: torch.randn(3, 2, I, dtype=torch.float64), None),
    "input rank": ("lstm", {}, lambda: torch.randn(3, 2, 1, I), None),
    "no steps": ("rnn", {}, lambda: torch.randn(0, 2, I), None),
    "hx rank": ("rnn", {}, lambda: torch.randn(3, 2, I), lambda: torch.randn(2, H)),
    "hx batch": ("gru", {}, lambda: torch.randn(3, 2, I), lambda: torch.randn(1, 3, H)),
    "hx layers": ("rnn", {"num_layers": 2}, lambda: torch.randn(3, 2, I), lambda: torch.randn(1, 2, H)),
    "hx dtype": ("rnn", {}, lambda: torch.randn(3, 2, I), lambda: torch.randn(1, 2, H, dtype=torch.float64)),
    "c shape": ("lstm", {}, lambda: torch.randn(3, 2, I), lambda: (torch.randn(1, 2, H), torch.randn(1, 2, H + 1))),
    "c None": ("lstm", {}, lambda: torch.randn(3, 2, I), lambda: (torch.randn(1, 2, H), None)),
    "three states": ("lstm", {}, lambda: torch.randn(3, 2, I), lambda: (torch.randn(1, 2, H),) * 3),
    "h of the projection": ("lstm", {"proj_size": P}, lambda: torch.randn(3, 2, I),
                            lambda: (torch.randn(1, 2, H), torch.randn(1, 2, H))),
    "unbatched hx rank": ("gru", {}, lambda: torch.randn(3, I), lambda: torch.randn(1, 1, H)),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_input_raises_the_regular_error(name, counted):
    cell, kwargs, make_input, make_hx = BAD_CALLS[name]
    module = make(cell, **kwargs)
    x, hx = make_input(), make_hx() if make_hx else None
    error = error_of(lambda: module(x, hx))
    with regular_path():
        expected = error_of(lambda: module(x, hx))
    assert expected is not None and error == expected


class Passthrough(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_hooks_autocast_and_function_modes(counted):
    """Module hooks run around the short path; under autocast it runs the
    ops in the autocast dtype, as the regular path does; under a
    __torch_function__ mode forward takes the regular path."""
    module = make("lstm", num_layers=2)
    x, hx = make_call(module, True, True)
    seen = []
    module.register_forward_pre_hook(lambda m, args: seen.append("pre"))
    module.register_forward_hook(lambda m, args, out: seen.append(out[0].dtype))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        short = outputs_and_grads(module, x, hx)
        with regular_path():
            regular = outputs_and_grads(module, x, hx)
    assert counted["n"] == 1 and seen == ["pre", torch.bfloat16] * 2
    assert_identical(short, regular)

    with torch.no_grad():
        short = outputs_and_grads(module, x, hx)
        with Passthrough():
            through_mode = outputs_and_grads(module, x, hx)
    assert counted["n"] == 2
    assert_identical(through_mode, short)


@pytest.mark.parametrize("cell", CELLS)
def test_other_calls_take_the_regular_path(cell, counted):
    """Two directions, packed input."""
    x = torch.randn(3, 2, I)
    make(cell, bidirectional=True)(x)
    make(cell)(nn.utils.rnn.pack_padded_sequence(x, [3, 2]))
    assert counted["n"] == 0


@pytest.mark.parametrize("cell", CELLS)
def test_a_computed_weight_on_the_short_path(cell, counted):
    """A weight computed by a parametrization reaches the short path through
    _flat_weights, rebuilt at each call as nn's forward rebuilds it: the
    same values and gradients (those of the parametrization's parameters
    included) as the regular path, and as nn's module parametrized alike."""
    module = make(cell, num_layers=2)
    nn.utils.parametrizations.weight_norm(module, "weight_hh_l1")
    x, hx = make_call(module, True, True, requires_grad=True)
    short, regular = both_paths(module, x, hx, counted)
    assert_identical(short, regular)
    twin = nn_twin(cell, make(cell, num_layers=2))
    nn.utils.parametrizations.weight_norm(twin, "weight_hh_l1")
    twin.load_state_dict(module.state_dict())
    expected = outputs_and_grads(twin, x, hx)
    for i, (a, b) in enumerate(zip(short, expected)):
        assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5), i


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore:`torch.jit.*deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
@pytest.mark.parametrize("cell", CELLS)
def test_compile_export_trace_and_func_take_the_regular_path(cell, counted):
    module = make(cell, num_layers=2).eval()
    x, hx = make_call(module, True, True)
    with torch.no_grad():
        expected = module(x, hx)[0]
        expected_no_hx = module(x)[0]
    counted["n"] = 0

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            compiled = torch.compile(module, fullgraph=True, backend="aot_eager")(x, hx)[0]
    finally:
        torch._dynamo.reset()
    assert torch.equal(compiled, expected)
    program = torch.export.export(module, (x, hx))
    assert "prnn.layers" not in str(program.graph)
    torch.testing.assert_close(program.module()(x, hx)[0], expected)
    with torch.no_grad():
        traced = torch.jit.trace(module, (x, hx), check_trace=False)
    assert "prnn::layers" not in str(traced.graph)
    torch.testing.assert_close(traced(x, hx)[0], expected)
    # vmap over the batch of unbatched calls: the batched call's output.
    with torch.no_grad():
        vmapped = torch.vmap(lambda x: module(x)[0], in_dims=1, out_dims=1)(x)
    torch.testing.assert_close(vmapped, expected_no_hx)
    with pytest.raises(RuntimeError, match="torch.func's autodiff"):
        torch.func.grad(lambda x: module(x)[0].sum())(x)
    assert counted["n"] == 0


@pytest.mark.filterwarnings("ignore:`torch.jit.*deprecated:DeprecationWarning")
def test_script_takes_the_regular_path(counted):
    model = Batched(make("rnn", num_layers=2))
    x, hx = make_call(model.rnn, True, True)
    scripted = torch.jit.script(model)
    with torch.no_grad():
        got = scripted(x, hx)
        assert counted["n"] == 0
        assert_identical(list(got), list(model(x, hx)))
    assert counted["n"] == 1  # the eager call


@needs_cuda
@pytest.mark.parametrize("cell", CELLS)
def test_cuda_graph_replays_the_short_path(cell, counted):
    """A timestep captured in a CUDA graph and replayed gives what eager gives."""
    module = make(cell, "cuda", num_layers=2).eval()
    x, hx = make_call(module, True, True, steps=1)
    static_x, static_hx = x.clone(), as_hx([state.clone() for state in flat(hx)])
    with torch.no_grad():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            module(static_x, static_hx)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out, static_h_n = module(static_x, static_hx)
        for _ in range(3):
            x.normal_()
            static_x.copy_(x)
            graph.replay()
            expected, expected_h_n = module(x, static_hx)
            assert_identical([static_out] + flat(static_h_n), [expected] + flat(expected_h_n))
    assert counted["n"] >= 5
