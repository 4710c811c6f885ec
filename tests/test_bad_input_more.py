"""Bad input to the public ops and the modules that once crashed, was
accepted or gave an unclear error, each case found by running many in fresh
processes: every test asserts a clear Python error of the right type that
names the argument and what was expected (for the modules: the exception
type nn.RNN / nn.LSTM / nn.GRU raise for the same input). A case that could
crash runs in a subprocess (conftest.run_python)."""

import math
import textwrap

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence

import torch_prnn
from conftest import run_python

P = torch.ops.prnn

pytestmark = pytest.mark.hang_guard(120)


def _run_case(code: str, timeout: int = 60):
    """Runs `code` (which defines `call()`) in a fresh interpreter; returns
    (returncode, output). The child prints the exception type and message
    call() raised, or RESULT-OK when it returned."""
    script = textwrap.dedent(
        """
        import torch, torch_prnn
        from torch import nn
        P = torch.ops.prnn
        torch.manual_seed(0)
        """
    ) + textwrap.dedent(code) + textwrap.dedent(
        """
        try:
            call()
            print("RESULT-OK")
        except Exception as error:
            print("RESULT-EXC", type(error).__name__, str(error).replace("\\n", " ")[:500])
        """
    )
    return run_python(["-c", script], timeout=timeout)


def _assert_clean_error(rc, out, exc_type, *words):
    assert rc == 0, f"the child process died (return code {rc}: segfault/abort):\n{out[-2000:]}"
    lines = [line for line in out.splitlines() if line.startswith("RESULT-")]
    assert lines, out[-2000:]
    assert lines[-1] != "RESULT-OK", "invalid input accepted without an error"
    _, name, message = lines[-1].split(" ", 2)
    assert name == exc_type, f"expected {exc_type}, got {name}: {message}"
    for word in words:
        assert word in message, f"message does not name {word!r}: {message}"


# ---- prnn::layers: the params list -------------------------------------------


@pytest.mark.parametrize(
    "layers, count",
    [(1, 1), (2, 2)],
    ids=["1-layer-1-param", "2-layers-2-params"],
)
def test_layers_lstm_one_param_per_layer_is_refused(layers, count):
    """An LSTM's params with one tensor a layer: 1 % 2 == 1 passes as 'a
    projection', then the op reads w[1] past the list's end (segfault with
    one layer; with two, a misleading 'w_hr must have shape' error)."""
    rc, out = _run_case(
        f"""
        lstm = nn.LSTM(5, 4, {layers})
        params = list(lstm._flat_weights)[:{count}]
        h = torch.zeros({layers}, 2, 4)
        def call():
            P.layers(torch.randn(3, 2, 5), h, h.clone(), params, "LSTM", 0.0)
        """
    )
    _assert_clean_error(rc, out, "RuntimeError", "prnn::layers", "params")


@pytest.mark.parametrize("extra", [2, 4], ids=["7-a-layer", "9-a-layer"])
def test_layers_lstm_unused_params_are_refused(extra):
    """params of 7 or 9 tensors a layer (odd: 'a projection', >= 4: 'biases')
    run with w[4].. ignored: invalid input silently accepted."""
    lstm = nn.LSTM(5, 4, proj_size=2)
    weights = list(lstm._flat_weights)  # w_ih, w_hh, b_ih, b_hh, w_hr
    params = weights[:4] + [torch.randn(3, 3) for _ in range(extra)] + weights[4:]
    with pytest.raises(RuntimeError, match=r"prnn::layers: params"):
        P.layers(torch.randn(3, 2, 5), torch.zeros(1, 2, 2), torch.zeros(1, 2, 4), params, "LSTM", 0.0)


@pytest.mark.parametrize(
    "h_layers, c",
    [(1, torch.zeros(3, 2, 4)), (2, torch.zeros(1, 2, 4)), (1, torch.tensor(0.0))],
    ids=["c-more-layers-than-h", "c-fewer-layers-than-h", "c-0-d"],
)
def test_layers_lstm_c_must_match_h(h_layers, c):
    """c with more layers than h is silently cut to h's; with fewer (or 0-D)
    select() raises an IndexError that does not say which argument."""
    params = list(nn.LSTM(5, 4, h_layers)._flat_weights)
    with pytest.raises(RuntimeError, match=r"prnn::layers: c\b"):
        P.layers(torch.randn(3, 2, 5), torch.zeros(h_layers, 2, 4), c, params, "LSTM", 0.0)


@pytest.mark.parametrize("dropout", [-0.5, math.nan], ids=["negative", "nan"])
def test_layers_dropout_must_be_a_probability(dropout):
    """dropout <= 0 or NaN skips the dropout: a negative or NaN probability
    is silently accepted (1.5 does raise, from at::dropout)."""
    params = list(nn.RNN(5, 4, 2)._flat_weights)
    with pytest.raises((RuntimeError, ValueError), match="dropout"):
        P.layers(torch.randn(3, 2, 5), torch.zeros(2, 2, 4), None, params, "RNN_TANH", dropout)


@pytest.mark.parametrize("mode, module", [("RNN_TANH", nn.RNN), ("LSTM", nn.LSTM)])
def test_layers_input_none_names_input(mode, module):
    """None for input: 'tensor does not have a device' (autograd's
    VariableInfo, the modules' parameters requiring grad) or, for an LSTM,
    at::linear's 'Expected a proper Tensor but got None ... argument #0
    'self''; neither says which argument."""
    params = list(module(5, 4)._flat_weights)  # parameters: require grad
    c = torch.zeros(1, 2, 4) if mode == "LSTM" else None
    with pytest.raises(RuntimeError, match=r"input must be a tensor"):
        P.layers(None, torch.zeros(1, 2, 4), c, params, mode, 0.0)


# ---- None for a required tensor while another input requires grad ------------


def _elman():
    return torch.randn(3, 2, 4), torch.randn(2, 4), torch.randn(4, 4)


def _none_cases():
    """(op, call with that argument None, argument name)."""
    def forward(missing):
        xp, h0, w = _elman()
        args = {"xp": xp.requires_grad_(), "h0": h0, "w_hh": w}
        if missing == "xp":
            args["h0"].requires_grad_()
        args[missing] = None
        return lambda: P.forward(args["xp"], args["h0"], args["w_hh"], None, "tanh")

    def layer(missing):
        args = {"x": torch.randn(3, 2, 5).requires_grad_(), "w_ih": torch.randn(4, 5), "h0": torch.randn(2, 4),
                "w_hh": torch.randn(4, 4)}
        args[missing] = None
        return lambda: P.layer(args["x"], args["w_ih"], None, None, args["h0"], args["w_hh"], None, "tanh")

    def lstm(missing):
        args = {"xp": torch.randn(3, 2, 16).requires_grad_(), "h0": torch.randn(2, 4), "c0": torch.randn(2, 4),
                "w_hh": torch.randn(16, 4)}
        args[missing] = None
        return lambda: P.lstm(args["xp"], None, args["h0"], args["c0"], args["w_hh"], None, None, False)

    def gru(missing):
        args = {"xp": torch.randn(3, 2, 12).requires_grad_(), "h0": torch.randn(2, 4), "w_hh": torch.randn(12, 4)}
        args[missing] = None
        return lambda: P.gru(args["xp"], None, args["h0"], args["w_hh"], None, False)

    cases = [("forward", forward, n) for n in ("xp", "h0", "w_hh")]
    cases += [("layer", layer, n) for n in ("w_ih", "h0", "w_hh")]
    cases += [("lstm", lstm, n) for n in ("h0", "c0", "w_hh")]
    cases += [("gru", gru, n) for n in ("h0", "w_hh")]
    return [pytest.param(make, name, id=f"{op}-{name}") for op, make, name in cases]


@pytest.mark.parametrize("make, name", _none_cases())
def test_none_for_required_tensor_with_grad_names_it(make, name):
    """Without grad the ops say 'h0 must be a tensor, got None'; with any
    input requiring grad the autograd kernel's Function::apply raises 'tensor
    does not have a device' first."""
    with pytest.raises(RuntimeError, match=rf"\b{name} must be a tensor, got None"):
        make(name)()


# ---- prnn::layer and prnn::packed_rows ----------------------------------------


def test_layer_bool_input_names_the_dtype():
    """bool x: the projection GEMM runs before the dtype check and raises
    '"addmm_impl_cpu_" not implemented for 'Bool'' (no argument, no
    expected dtypes); int inputs get prnn::forward's dtype message."""
    x = torch.ones(3, 2, 5, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="float32, float64, float16 or bfloat16"):
        P.layer(x, x[0, :1].expand(4, 5).contiguous(), None, None, torch.ones(2, 4, dtype=torch.bool),
                torch.ones(4, 4, dtype=torch.bool), None, "tanh")


@pytest.mark.parametrize(
    "batch_sizes, batch, rows",
    [(torch.tensor([[2, 1]]), 2, 3), (None, 2, 3), (torch.tensor([2, -1]), 2, 1)],
    ids=["2-d", "None", "negative"],
)
def test_packed_rows_bad_batch_sizes_names_it(batch_sizes, batch, rows):
    """2-D batch_sizes: 'only one element tensors can be converted to Python
    scalars'; None: AttributeError ''NoneType' object has no attribute
    'numel''; a negative size that keeps the sum: accepted."""
    with pytest.raises((RuntimeError, TypeError, ValueError), match="batch_sizes"):
        P.packed_rows(batch_sizes, batch, rows)


@pytest.mark.parametrize("op", ["packed_rows", "check_packed"])
def test_packed_ops_fake_checks_as_the_op(op):
    """The fake kernels (torch.compile, FakeTensorMode, the meta device)
    refuse what the ops refuse without reading batch_sizes' values: its rank,
    dtype and device, and a negative batch."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    fn = getattr(P, op)
    cases = [(torch.tensor([2.0, 1.0]), 2, 3, TypeError, "1-D tensor of integers, got other values"),
             (torch.tensor([[2, 1]]), 2, 3, TypeError, "1-D tensor of integers, got 2-D"),
             (torch.tensor([2, 1]), -2, 3, ValueError, "batch and the number of data rows must be >= 0, got -2")]
    for batch_sizes, batch, rows, error, message in cases:
        with pytest.raises(error, match=message):
            fn(batch_sizes, batch, rows)
        with FakeTensorMode() as mode:
            fake = mode.from_tensor(batch_sizes)
            with pytest.raises(error, match=message):
                fn(fake, batch, rows)
    with pytest.raises(RuntimeError, match="batch_sizes must be on the CPU, got one on meta"):
        fn(torch.tensor([2, 1], device="meta"), 2, 3)


@pytest.mark.parametrize("cls", [torch_prnn.PersistentRNN, torch_prnn.PersistentLSTM, torch_prnn.PersistentGRU])
def test_negative_first_batch_size_names_batch_sizes(cls):
    """A hand-built PackedSequence whose first batch size is negative: the
    batch_sizes error, before a state is made from that size ('negative
    dimension')."""
    with pytest.raises(RuntimeError, match=r"batch_sizes must be non-negative.* got batch_sizes \[-2, 3\] for 1 rows"):
        cls(4, 6)(PackedSequence(torch.randn(1, 4), torch.tensor([-2, 3])))


# ---- the modules against nn ---------------------------------------------------

_MODULES = [
    pytest.param(torch_prnn.PersistentRNN, nn.RNN, id="RNN"),
    pytest.param(torch_prnn.PersistentLSTM, nn.LSTM, id="LSTM"),
    pytest.param(torch_prnn.PersistentGRU, nn.GRU, id="GRU"),
]


def _nn_error(module, *args):
    try:
        module(*args)
    except Exception as error:  # noqa: BLE001 - its type is what the test compares
        return error
    return None


@pytest.mark.parametrize("ours_cls, nn_cls", _MODULES)
@pytest.mark.parametrize(
    "rows, batch_sizes",
    [(2, [3, -1]), (1, [2, -1]), (3, [2.5, 0.5]), (3, [[2, 1]])],
    ids=["negative-first-step-too-big", "negative-tail", "fractional", "2-d"],
)
def test_module_packed_bad_batch_sizes_raise_like_nn(ours_cls, nn_cls, rows, batch_sizes):
    """A PackedSequence whose batch_sizes are negative (IndexError from
    index_copy_ where nn raises RuntimeError), fractional (silently run as
    [2, 1] where nn raises TypeError) or 2-D (ValueError 'only one element
    tensors ...' where nn raises TypeError)."""
    torch.manual_seed(0)
    ours = ours_cls(5, 4, 2)
    reference = nn_cls(5, 4, 2)
    packed = PackedSequence(torch.randn(rows, 5), torch.tensor(batch_sizes))
    expected = _nn_error(reference, packed)
    assert expected is not None  # nn refuses every one of these
    with pytest.raises(type(expected), match="batch_sizes"):
        ours(packed)


@pytest.mark.torch_fallback
@pytest.mark.parametrize(
    "make",
    [
        # frozen: a forward of 2-3 steps at B * H = 512, which the CPU hands to nn.LSTM
        pytest.param(lambda: torch_prnn.PersistentLSTM(3, 256).requires_grad_(False), id="LSTM-frozen"),
        pytest.param(lambda: torch_prnn.PersistentLSTM(3, 4), id="LSTM"),  # a packed training call: ours
        pytest.param(lambda: torch_prnn.PersistentRNN(3, 4), id="RNN"),
        pytest.param(lambda: torch_prnn.PersistentGRU(3, 4), id="GRU"),
    ],
)
@pytest.mark.parametrize("autocast", [False, True], ids=["plain", "cpu-autocast"])  # autocast: handed over to torch
@pytest.mark.parametrize("rows, batch_sizes", [(3, [2, 0, 1]), (4, [2, 1])], ids=["growing", "rows-left-over"])
def test_malformed_batch_sizes_raise_whichever_code_runs(make, autocast, rows, batch_sizes):
    """A hand-built PackedSequence that nn's recurrence runs unchecked (2
    rows out for 3 in, or a row dropped): the batch_sizes error both where
    ours runs and where the call is handed over to torch's recurrence."""
    torch.manual_seed(0)
    packed = PackedSequence(torch.randn(rows, 3), torch.tensor(batch_sizes))
    with torch.autocast("cpu", enabled=autocast):
        with pytest.raises(RuntimeError, match=r"batch_sizes must be non-negative, non-increasing and sum to the "
                                               r"number of data rows"):
            make()(packed)


@pytest.mark.parametrize("ours_cls, nn_cls", _MODULES)
def test_packed_sorted_indices_of_another_batch_raise(ours_cls, nn_cls):
    """sorted_indices of fewer entries than batch_sizes[0]: nn gives h_n
    of sorted_indices' batch (a wrong state) without an error."""
    packed = tuple.__new__(PackedSequence, (torch.randn(3, 3), torch.tensor([2, 1]), torch.tensor([0]),
                                            torch.tensor([0])))
    assert nn_cls(3, 4)(packed)[1] is not None  # nn runs it
    with pytest.raises(RuntimeError, match="batch_sizes\\[0\\] is a batch of 2 sequences, but sorted_indices has 1"):
        ours_cls(3, 4)(packed)


@pytest.mark.parametrize("ours_cls, nn_cls", _MODULES)
@pytest.mark.parametrize("rows", [0, 3])
def test_module_packed_empty_batch_sizes_raise_like_nn(ours_cls, nn_cls, rows):
    """Empty batch_sizes, with or without data rows: nn's exception type
    (IndexError, reading the batch from batch_sizes[0])."""
    packed = PackedSequence(torch.randn(rows, 5), torch.tensor([], dtype=torch.int64))
    expected = _nn_error(nn_cls(5, 4, 2), packed)
    assert expected is not None
    with pytest.raises(type(expected)):
        ours_cls(5, 4, 2)(packed)


@pytest.mark.parametrize("ours_cls, nn_cls", _MODULES)
def test_module_flat_weight_none_raises_like_nn(ours_cls, nn_cls):
    """_flat_weights[1] = None (the README: assigning an element changes
    what forward runs, as with nn's): nn raises TypeError 'expected Tensor
    as element 1 ...'; ours RuntimeError 'tensor does not have a device'."""
    torch.manual_seed(0)
    ours, reference = ours_cls(5, 4, 2), nn_cls(5, 4, 2)
    ours._flat_weights[1] = None
    reference._flat_weights[1] = None
    x = torch.randn(3, 2, 5)
    expected = _nn_error(reference, x)
    assert isinstance(expected, TypeError)
    with pytest.raises(TypeError):
        ours(x)
