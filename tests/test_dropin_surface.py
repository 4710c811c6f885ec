"""The parts of nn.RNN's surface that code around a model touches: the
attributes nn.RNN code reads (mode, _flat_weights_names, _flat_weights),
TorchScript, whole-model checkpoints loaded with torch.load's default
weights_only=True, and torch.compile(fullgraph=True) with packed input."""

import copy

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

import torch_prnn
from conftest import Batched, assert_close, devices, needs_cuda, rel_err, twins

# Configurations whose attributes differ: nonlinearity, bias, layers, directions.
CONFIGS = [
    dict(),
    dict(nonlinearity="relu", bias=False),
    dict(num_layers=2, bidirectional=True),
]


# ---- nn.RNN's attributes: mode, _flat_weights_names, _flat_weights ----------


def same_objects(a, b):
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


@pytest.mark.parametrize("kwargs", CONFIGS, ids=str)
def test_attributes_match_nn_rnn(kwargs):
    ours = torch_prnn.PersistentRNN(3, 5, **kwargs)
    theirs = nn.RNN(3, 5, **kwargs)
    assert ours.mode == theirs.mode
    assert ours._flat_weights_names == theirs._flat_weights_names
    assert ours._all_weights == theirs._all_weights
    assert [w.shape for w in ours._flat_weights] == [w.shape for w in theirs._flat_weights]
    assert same_objects(ours._flat_weights, list(ours.parameters()))


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("overwrite", [False, True], ids=["in place", "overwrite"])
def test_flat_weights_follow_to(device, overwrite):
    """.to() keeps _flat_weights the module's parameters, also where torch is
    set to put new Parameter objects in the module on conversion."""
    ours = torch_prnn.PersistentRNN(3, 5, num_layers=2)
    previous = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
    try:
        ours.to(device, torch.float64)
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(previous)
    assert same_objects(ours._flat_weights, list(ours.parameters()))
    assert all(w.dtype == torch.float64 and w.device.type == device for w in ours._flat_weights)


def test_flat_weights_follow_load_state_dict_and_assignment():
    ours = torch_prnn.PersistentRNN(3, 5, bidirectional=True)
    source = torch_prnn.PersistentRNN(3, 5, bidirectional=True).state_dict()
    ours.load_state_dict(source)  # copies into the same parameters
    assert same_objects(ours._flat_weights, list(ours.parameters()))
    assert all(torch.equal(w, source[n]) for n, w in zip(ours._flat_weights_names, ours._flat_weights))
    ours.load_state_dict(source, assign=True)  # new parameters, on the state dict's tensors
    assert ours.weight_ih_l0.data_ptr() == source["weight_ih_l0"].data_ptr()
    assert same_objects(ours._flat_weights, list(ours.parameters()))
    replacement = nn.Parameter(torch.randn(5, 5))
    ours.weight_hh_l0_reverse = replacement
    assert ours._flat_weights[ours._flat_weights_names.index("weight_hh_l0_reverse")] is replacement
    assert same_objects(ours._flat_weights, list(ours.parameters()))


@pytest.mark.parametrize("device", devices)
def test_code_reading_flat_weights(device):
    """Code written against nn.RNN's _flat_weights (here: scaling every weight
    in place) does to a PersistentRNN what it does to nn.RNN."""
    ours, theirs = twins(device, torch.float64, num_layers=2, bidirectional=True)
    with torch.no_grad():
        for module in (ours, theirs):
            for w in module._flat_weights:
                w.mul_(0.5)
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        assert torch.equal(p, q), name
    x = torch.randn(5, 3, 4, dtype=torch.float64, device=device)
    assert_close(ours(x)[0], theirs(x)[0], torch.float64, "output")


def test_data_parallel_replica_keeps_its_own_flat_weights():
    """A data-parallel replica sets its weights on itself; the original's
    _flat_weights stay the original's parameters."""
    ours = torch_prnn.PersistentRNN(3, 5)
    replica = ours._replicate_for_data_parallel()
    replica.weight_hh_l0 = ours.weight_hh_l0.detach().clone()  # what replicate() does
    assert replica._flat_weights[1] is replica.weight_hh_l0
    assert same_objects(ours._flat_weights, list(ours.parameters()))


def test_unpickling_a_module_without_the_attributes():
    """A module pickled before these attributes existed gets them on loading."""
    ours = torch_prnn.PersistentRNN(3, 5, nonlinearity="relu", num_layers=2)
    state = dict(ours.__dict__)
    for name in ("mode", "_flat_weights_names", "_flat_weights"):
        del state[name]
    loaded = torch_prnn.PersistentRNN.__new__(torch_prnn.PersistentRNN)
    loaded.__setstate__(copy.copy(state))
    assert loaded.mode == "RNN_RELU"
    assert loaded._flat_weights_names == ours._flat_weights_names
    assert same_objects(loaded._flat_weights, list(ours.parameters()))


# ---- whole-model checkpoints under torch.load's default weights_only=True ----


class Tagger(nn.Module):
    """A model as a training script has it: its own class around the RNN."""

    def __init__(self, rnn_class):
        super().__init__()
        self.rnn = rnn_class(4, 8, num_layers=2, bidirectional=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        y, h_n = self.rnn(x)
        return self.head(y), h_n


@pytest.mark.parametrize("device", devices)
def test_whole_model_checkpoint_loads_with_weights_only(device, tmp_path):
    """A script that saves torch.save(model) and loads it with torch.load's
    default, allow-listing the classes of its nn.RNN model, loads the model
    after nn.RNN is swapped for PersistentRNN, with the same outputs."""
    allow_list = [Tagger, nn.Linear, nn.RNN]  # what the script allow-lists for its nn.RNN model
    with_nn_rnn = Tagger(nn.RNN).to(device)
    torch.save(with_nn_rnn, tmp_path / "nn_rnn.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(tmp_path / "nn_rnn.pt")  # the default is in force: unlisted classes refused
    with torch.serialization.safe_globals(allow_list):
        torch.load(tmp_path / "nn_rnn.pt")

    model = Tagger(torch_prnn.PersistentRNN).to(device).eval()
    torch.save(model, tmp_path / "prnn.pt")
    with torch.serialization.safe_globals(allow_list):
        loaded = torch.load(tmp_path / "prnn.pt")
    assert type(loaded.rnn) is torch_prnn.PersistentRNN and not loaded.training
    assert same_objects(loaded.rnn._flat_weights, list(loaded.rnn.parameters()))
    x = torch.randn(3, 5, 4, device=device)
    for got, expected in zip(loaded(x), model(x), strict=True):
        assert torch.equal(got, expected)


def test_bare_module_checkpoint_loads_with_weights_only(tmp_path):
    model = torch_prnn.PersistentRNN(4, 8, nonlinearity="relu", batch_first=True)
    torch.save(model, tmp_path / "rnn.pt")
    loaded = torch.load(tmp_path / "rnn.pt")
    x = torch.randn(2, 5, 4)
    assert repr(loaded) == repr(model)
    for got, expected in zip(loaded(x), model(x), strict=True):
        assert torch.equal(got, expected)


# ---- TorchScript ----------------------------------------------------------
# As with nn.RNN, a scripted model calls the RNN with one input type per
# call site (its forward is compiled once per input type). torch itself
# deprecates torch.jit.script and torch.jit.save / load.

script_tests = pytest.mark.filterwarnings("ignore:`torch.jit.*deprecated:DeprecationWarning")


class Packed(nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x: PackedSequence, hx: torch.Tensor | None = None):
        return self.rnn(x, hx)


def assert_same(got, expected):
    for a, b in zip(got, expected, strict=True):
        if isinstance(b, PackedSequence):
            for field in ("batch_sizes", "sorted_indices", "unsorted_indices"):
                x, y = getattr(a, field), getattr(b, field)
                assert (x is None and y is None) or torch.equal(x, y), field
            a, b = a.data, b.data
        elif isinstance(b, tuple):  # LSTM's (h_n, c_n)
            assert_same(a, b)
            continue
        assert torch.equal(a, b)


SCRIPT_CONFIGS = [
    dict(num_layers=2, bidirectional=True),
    dict(nonlinearity="relu", bias=False, batch_first=True),
]


def outputs_and_grads(model, x, parameters):
    output, h_n = model(x)
    return [output, h_n, *torch.autograd.grad(output.sum() + h_n.sum(), [x, *parameters])]


@script_tests
@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("kwargs", SCRIPT_CONFIGS, ids=str)
def test_script_matches_eager(device, kwargs):
    """Batched and unbatched input, hx given and absent: the scripted model's
    outputs, and gradients, are eager's."""
    rnn = torch_prnn.PersistentRNN(4, 7, device=device, dtype=torch.float64, **kwargs)
    model = Batched(rnn)
    scripted = torch.jit.script(model)
    layers = rnn.num_layers * (2 if rnn.bidirectional else 1)
    x = torch.randn(3, 5, 4, dtype=torch.float64, device=device)
    hx = torch.randn(layers, 3 if rnn.batch_first else 5, 7, dtype=torch.float64, device=device)
    for input, h in [(x, None), (x, hx), (x[0], None), (x[0], hx[:, 0])]:
        assert_same(scripted(input, h), model(input, h))
    x.requires_grad_()
    assert_same(outputs_and_grads(scripted, x, rnn.parameters()), outputs_and_grads(model, x, rnn.parameters()))


@script_tests
@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_script_packed_matches_eager(device, enforce_sorted):
    rnn = torch_prnn.PersistentRNN(4, 7, num_layers=2, bidirectional=True, device=device, dtype=torch.float64)
    model = Packed(rnn)
    scripted = torch.jit.script(model)
    lengths = torch.tensor([5, 3, 3, 1]) if enforce_sorted else torch.tensor([3, 5, 1, 3])
    x = torch.randn(5, 4, 4, dtype=torch.float64, device=device)
    packed = pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
    hx = torch.randn(4, 4, 7, dtype=torch.float64, device=device)
    for h in (None, hx):
        assert_same(scripted(packed, h), model(packed, h))


# PersistentLSTM and PersistentGRU script as nn.LSTM and nn.GRU do; the
# scripted module always runs torch_prnn's ops, also where eager hands the
# call to torch's own recurrence.


class LSTMBatched(nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None):
        return self.rnn(x, hx)


class LSTMPacked(nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x: PackedSequence, hx: tuple[torch.Tensor, torch.Tensor] | None = None):
        return self.rnn(x, hx)


# cell: (module, the op its forward direction runs, wrappers for tensor and packed input)
CELLS = {
    "rnn": (torch_prnn.PersistentRNN, "prnn::layer", Batched, Packed),
    "lstm": (torch_prnn.PersistentLSTM, "prnn::lstm", LSTMBatched, LSTMPacked),
    "gru": (torch_prnn.PersistentGRU, "prnn::gru", Batched, Packed),
}

GATED_SCRIPT_CONFIGS = [
    ("lstm", dict(num_layers=2, bidirectional=True)),
    ("lstm", dict(bias=False, batch_first=True, proj_size=3)),
    ("lstm", dict(num_layers=2, bidirectional=True, dropout=0.5, proj_size=2)),
    ("gru", dict(num_layers=2, bidirectional=True)),
    ("gru", dict(bias=False, batch_first=True, num_layers=2, dropout=0.5)),
]


def script(cell, packed=False, device="cpu", dtype=torch.float64, **kwargs):
    """A module of `cell` in its wrapper, and the wrapper scripted, checked
    to call the cell's op and none of torch's recurrences (aten::rnn_tanh,
    aten::lstm, aten::gru, ...)."""
    cls, op, batched_wrapper, packed_wrapper = CELLS[cell]
    rnn = cls(4, 7, device=device, dtype=dtype, **kwargs)
    model = (packed_wrapper if packed else batched_wrapper)(rnn)
    scripted = torch.jit.script(model)
    graph = str(scripted.inlined_graph)
    assert op in graph and f"aten::{cell}" not in graph, graph
    return rnn, model, scripted


def random_hx(rnn, batch, device):
    """A random hx for `batch` sequences, requiring grad: h, or LSTM's (h, c)."""
    layers = rnn.num_layers * (2 if rnn.bidirectional else 1)
    sizes = [rnn.proj_size or rnn.hidden_size] + ([rnn.hidden_size] if isinstance(rnn, torch_prnn.PersistentLSTM) else [])
    hx = [torch.randn(layers, batch, size, dtype=torch.float64, device=device, requires_grad=True) for size in sizes]
    return tuple(hx) if len(hx) == 2 else hx[0]


def unbatched_hx(hx):
    return tuple(t[:, 0] for t in hx) if isinstance(hx, tuple) else hx[:, 0]


def values_and_grads(model, input, hx, parameters):
    """model(input, hx)'s output, final states and the gradients of their sum
    with respect to the input (a packed input's data), hx and the parameters,
    with the same dropout mask on every call."""
    torch.manual_seed(1)
    output, h_n = model(input, hx)
    # A scripted module's packed output is a namedtuple of its own, as nn.LSTM's.
    values = [output.data if hasattr(output, "batch_sizes") else output]
    values += list(h_n) if isinstance(h_n, tuple) else [h_n]
    hx_leaves = [] if hx is None else list(hx) if isinstance(hx, tuple) else [hx]
    leaves = [input.data if isinstance(input, PackedSequence) else input, *hx_leaves, *parameters]
    return values + list(torch.autograd.grad(sum(v.sum() for v in values), leaves))


@script_tests
@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("cell,kwargs", GATED_SCRIPT_CONFIGS, ids=str)
def test_gated_script_matches_eager(device, cell, kwargs):
    """Batched and unbatched input, hx given and absent, in training mode
    (dropout included): the scripted model's outputs, final states and
    gradients are eager's, to the bit."""
    rnn, model, scripted = script(cell, device=device, **kwargs)
    x = torch.randn(3, 5, 4, dtype=torch.float64, device=device, requires_grad=True)
    hx = random_hx(rnn, 3 if rnn.batch_first else 5, device)
    for input, h in [(x, None), (x, hx), (x[0], None), (x[0], unbatched_hx(hx))]:
        got = values_and_grads(scripted, input, h, rnn.parameters())
        assert_same(got, values_and_grads(model, input, h, rnn.parameters()))


@script_tests
@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("enforce_sorted", [True, False])
@pytest.mark.parametrize("cell,kwargs", [("lstm", dict(proj_size=3)), ("lstm", {}), ("gru", {})], ids=str)
def test_gated_script_packed_matches_eager(device, enforce_sorted, cell, kwargs):
    rnn, model, scripted = script(cell, packed=True, device=device, num_layers=2, bidirectional=True, **kwargs)
    lengths = torch.tensor([5, 3, 3, 1]) if enforce_sorted else torch.tensor([3, 5, 1, 3])
    x = torch.randn(5, 4, 4, dtype=torch.float64, device=device)
    packed = pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
    packed = PackedSequence(packed.data.requires_grad_(), packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices)
    for h in (None, random_hx(rnn, 4, device)):
        assert_same(scripted(packed, h), model(packed, h))
        got = values_and_grads(scripted, packed, h, rnn.parameters())
        assert_same(got, values_and_grads(model, packed, h, rnn.parameters()))


# Calls forward refuses: (name, cell, packed input, make (input, hx)); the Elman cell scripts by the same methods.
BAD_CALLS = [
    ("4-D input", "lstm", False, lambda: (torch.randn(2, 5, 3, 4), None)),
    ("hx rank", "lstm", False, lambda: (torch.randn(5, 3, 4), (torch.randn(1, 3, 7), torch.randn(3, 7)))),
    ("hx batch", "gru", False, lambda: (torch.randn(5, 3, 4), torch.randn(1, 2, 7))),
    ("unbatched hx rank", "gru", False, lambda: (torch.randn(5, 4), torch.randn(1, 1, 7))),
    ("input size", "gru", False, lambda: (torch.randn(5, 3, 6), None)),
    ("no steps", "lstm", False, lambda: (torch.randn(0, 3, 4), None)),
    ("malformed packing", "gru", True, lambda: (PackedSequence(torch.randn(10, 4), torch.tensor([3, 2, 3, 1, 1])), None)),
    ("negative batch size", "lstm", True, lambda: (PackedSequence(torch.randn(1, 4), torch.tensor([-2, 3])), None)),
    ("packed hx batch", "lstm", True,
     lambda: (pack_padded_sequence(torch.randn(5, 3, 4), torch.tensor([3, 5, 1]), enforce_sorted=False),
              (torch.randn(1, 2, 7), torch.randn(1, 2, 7)))),
    # hx's shape before batch_sizes' values, as eager (and nn) check them
    ("packed hx batch, malformed packing", "rnn", True,
     lambda: (PackedSequence(torch.randn(3, 4), torch.tensor([1, 2])), torch.randn(1, 5, 7))),
]


@script_tests
@pytest.mark.parametrize("name,cell,packed,make", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_script_refuses_as_eager(name, cell, packed, make):
    """The scripted forward refuses what eager refuses, with its error type
    and message."""
    _, model, scripted = script(cell, packed=packed, dtype=torch.float32)
    input, hx = make()
    with pytest.raises(Exception) as eager:
        model(input, hx)
    with pytest.raises(torch.jit.Error) as scripted_error:
        scripted(input, hx)
    assert f"builtins.{type(eager.value).__name__}: {eager.value}" in str(scripted_error.value)


@script_tests
@pytest.mark.torch_fallback
def test_gated_script_stays_on_torch_prnn(monkeypatch):
    """Where eager hands the call to torch's recurrence (an LSTM on the
    CPU), the scripted module runs torch_prnn's op: eager's numbers with the
    hand-over off."""
    _, model, scripted = script("lstm", dtype=torch.float32)
    x = torch.randn(5, 3, 4)
    got = scripted(x)
    monkeypatch.setattr(torch_prnn._crossover, "enabled", False)
    assert_same(got, model(x))


@script_tests
@pytest.mark.parametrize("cell", CELLS)
def test_script_twice_and_save_load(cell, tmp_path):
    """Scripting twice in one process (the same model, then another one), and
    scripted models saved with torch.jit.save and loaded back, as nn's are:
    eager's outputs, and gradients that reach the loaded module's own
    parameters."""
    rnn, model, first = script(cell, num_layers=2, bidirectional=True)
    second = torch.jit.script(model)
    _, other, scripted_other = script(cell, bias=False, batch_first=True)
    scripted_packed = torch.jit.script(CELLS[cell][3](rnn))
    x = torch.randn(5, 3, 4, dtype=torch.float64, requires_grad=True)
    assert_same(first(x), model(x))
    assert_same(second(x), model(x))
    assert_same(scripted_other(x), other(x))
    torch.jit.save(first, tmp_path / "batched.pt")
    torch.jit.save(scripted_packed, tmp_path / "packed.pt")
    loaded, loaded_packed = torch.jit.load(tmp_path / "batched.pt"), torch.jit.load(tmp_path / "packed.pt")
    expected = values_and_grads(model, x, None, rnn.parameters())
    assert_same(values_and_grads(loaded, x, None, loaded.parameters()), expected)
    sequence = pack_padded_sequence(x, torch.tensor([5, 2, 1]))
    assert_same(loaded_packed(sequence), rnn(sequence))


# ---- torch.compile(fullgraph=True) with PackedSequence input ----------------


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _states(h_n):
    """h_n, or an LSTM's (h_n, c_n), as a list."""
    return list(h_n) if isinstance(h_n, tuple) else [h_n]


def _hx(cell, h):
    return (h, torch.randn_like(h)) if cell == "lstm" and h is not None else h


def packed_outputs_and_grads(model, x, lengths, enforce_sorted, hx=None):
    """The packed output's data, the final states, and their gradients with
    respect to x and the parameters; x is packed here, per call, as a
    training step does."""
    output, h_n = model(pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted), hx)
    states = _states(h_n)
    loss = output.data.square().sum() + sum(state.sin().sum() for state in states)
    return [output.data, *states, *torch.autograd.grad(loss, [x, *model.parameters()])]


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("device", devices)
def test_compile_packed_fullgraph(device, cell, fresh_dynamo):
    """Under the default backend, sorted packed input without hx, where the
    batch is only in batch_sizes' data: eager's output, and no recompile for
    other batches and lengths."""
    model = CELLS[cell][0](4, 6, bidirectional=True, device=device)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=counter)
    compiles = None
    for steps, lengths in [(5, [5, 3, 2]), (4, [4, 4, 3, 1])]:
        packed = pack_padded_sequence(torch.randn(steps, len(lengths), 4, device=device), torch.tensor(lengths))
        with torch.no_grad():
            got, expected = compiled(packed), model(packed)
        assert_close(got[0].data, expected[0].data, torch.float32, f"output at lengths {lengths}")
        for got_state, expected_state in zip(_states(got[1]), _states(expected[1]), strict=True):
            assert_close(got_state, expected_state, torch.float32, f"final state at lengths {lengths}")
        compiles = compiles or counter.frame_count
    assert counter.frame_count == compiles


@pytest.mark.parametrize("cell", CELLS)
def test_compile_packed_int32_batch_sizes(cell, fresh_dynamo):
    """batch_sizes of int32 (a hand-built PackedSequence): eager's result
    compiled too (prnn::packed_rows' fake kernel gives int64 lengths, as the
    op does)."""
    model = CELLS[cell][0](4, 6)
    packed = pack_padded_sequence(torch.randn(5, 3, 4), torch.tensor([5, 3, 2]), enforce_sorted=False)
    packed = PackedSequence(packed.data, packed.batch_sizes.int(), packed.sorted_indices, packed.unsorted_indices)
    got = torch.compile(model, fullgraph=True, backend="aot_eager")(packed)
    expected = model(packed)
    assert torch.equal(got[0].data, expected[0].data)
    for a, b in zip(_states(got[1]), _states(expected[1]), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("device", devices)
def test_compile_packed_gradients(device, cell, fresh_dynamo):
    """Packed input sorted and not, hx absent and given: eager's outputs and
    gradients."""
    model = CELLS[cell][0](4, 6, num_layers=2, bidirectional=True, device=device)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(5, 3, 4, device=device, requires_grad=True)
    hx = _hx(cell, torch.randn(4, 3, 6, device=device))
    for lengths, enforce_sorted, h in [([5, 3, 2], True, None), ([5, 3, 2], True, hx), ([3, 5, 2], False, hx)]:
        got = packed_outputs_and_grads(compiled, x, torch.tensor(lengths), enforce_sorted, h)
        expected = packed_outputs_and_grads(model, x, torch.tensor(lengths), enforce_sorted, h)
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("device", devices)
def test_compile_packed_bad_input(device, cell, fresh_dynamo):
    """A hand-built PackedSequence that does not fit hx, or whose batch_sizes
    are malformed: an error when the compiled graph runs."""
    model = CELLS[cell][0](4, 6, num_layers=2, bidirectional=True, device=device)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    data = torch.randn(10, 4, device=device)
    hx = _hx(cell, torch.randn(4, 3, 6, device=device))
    too_few = PackedSequence(data[:8], torch.tensor([2, 2, 2, 1, 1]))  # 2 sequences, hx has 3
    with pytest.raises(RuntimeError, match=r"batch_sizes \[2, 2, 2, 1, 1\] is a batch of 2 sequences"):
        compiled(too_few, hx)
    malformed = PackedSequence(data, torch.tensor([3, 2, 3, 1, 1]))
    with pytest.raises(RuntimeError, match=r"non-increasing .* got batch_sizes \[3, 2, 3, 1, 1\] for 10 rows"):
        compiled(malformed, hx)


def test_packed_rows_op():
    """The op compiled graphs call for packed input: its fake kernel, schema
    and dispatch agree with its implementation."""
    torch.library.opcheck(torch.ops.prnn.packed_rows.default, (torch.tensor([3, 2, 2, 1]), 3, 8))
    lengths, rows = torch.ops.prnn.packed_rows(torch.tensor([3, 2, 2, 1]), 3, 8)
    assert lengths.tolist() == [4, 3, 1] and rows.tolist() == [0, 1, 2, 3, 4, 6, 7, 9]


@script_tests
@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated:FutureWarning")
@pytest.mark.parametrize(
    "parametrize",
    [torch.nn.utils.parametrizations.weight_norm, torch.nn.utils.weight_norm],
    ids=["parametrizations.weight_norm", "weight_norm hook"],
)
@pytest.mark.parametrize("cell", CELLS)
def test_script_refuses_computed_weights(parametrize, cell):
    """A weight computed by a parametrization cannot be scripted (nor can
    nn's): one clear error at script time, naming the supported paths,
    never a scripted model running on the raw weight."""
    cls, _, wrapper, _ = CELLS[cell]
    rnn = cls(4, 7)
    parametrize(rnn, "weight_hh_l0")
    nn_name = cell.upper()  # nn.RNN, nn.LSTM, nn.GRU
    with pytest.raises(RuntimeError, match=rf"\['weight_hh_l0'\] are computed .*\(nor for nn\.{nn_name}\); "
                       "torch.compile and torch.export do"):
        torch.jit.script(wrapper(rnn))


@pytest.mark.torch_fallback
def test_compile_where_eager_hands_over(fresh_dynamo):
    """CPU calls with gradients that eager hands to torch's recurrence,
    which does not trace there - oneDNN's LSTM, packed input under CPU
    autocast (batch_sizes read as data) - run ours under torch.compile:
    nn's values and gradients, fullgraph for the packed ones."""
    torch.manual_seed(0)
    ours = torch_prnn.PersistentLSTM(8, 256)  # eager: nn.LSTM's oneDNN LSTM on the CPU
    theirs = nn.LSTM(8, 256)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(5, 2, 8, requires_grad=True)
    got, want = torch.compile(ours)(x), theirs(x)
    assert rel_err(got[0], want[0]) < 1e-5 and rel_err(got[1][0], want[1][0]) < 1e-5
    grads = [torch.autograd.grad(y[0].square().sum(), [x, m.weight_hh_l0]) for y, m in ((got, ours), (want, theirs))]
    assert all(rel_err(a, b) < 1e-4 for a, b in zip(*grads))
    packed = pack_padded_sequence(torch.randn(5, 2, 8), torch.tensor([5, 3]))
    assert rel_err(torch.compile(ours, fullgraph=True)(packed)[0].data, theirs(packed)[0].data) < 1e-5
    rnn = torch_prnn.PersistentRNN(8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # eager: handed over to nn.RNN's autocast
        out = torch.compile(rnn, fullgraph=True)(packed)[0].data
    assert out.shape == (8, 16) and out.dtype == torch.bfloat16


@pytest.mark.torch_fallback
@needs_cuda
@pytest.mark.parametrize("case", ["lstm_proj_size", "rnn_past_the_limits"])
def test_compile_packed_handed_over_on_cuda(case, fresh_dynamo):
    """A packed CUDA call that eager hands to torch's recurrence (an LSTM
    with proj_size; an Elman batch past the limits) under torch.compile:
    with fullgraph=True ours compiles where nn's module does and raises
    where nn's raises; without it, nn's values."""
    torch.manual_seed(0)
    if case == "lstm_proj_size":
        cell, theirs, batch = "lstm", nn.LSTM(8, 32, proj_size=16, device="cuda"), 3
        ours = torch_prnn.PersistentLSTM.from_lstm(theirs)
    else:
        cell, theirs, batch = "rnn", nn.RNN(8, 256, device="cuda"), 64
        ours = torch_prnn.PersistentRNN.from_rnn(theirs)
    lengths = torch.arange(batch, 0, -1) % 5 + 1
    packed = pack_padded_sequence(torch.randn(5, batch, 8, device="cuda"), lengths.sort(descending=True)[0])
    assert torch_prnn.plan(ours.hidden_size, batch, 5, device="cuda", cell=cell,
                           proj_size=ours.proj_size, backward=True)["module"] == "torch"

    def full_graph(module):
        torch._dynamo.reset()
        try:
            return torch.compile(module, fullgraph=True)(packed)[0].data
        except Exception as error:  # noqa: BLE001 - compared with nn's below
            return type(error)

    got, want = full_graph(ours), full_graph(theirs)
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"nn's module compiles with fullgraph=True, ours raised {got}"
        assert rel_err(got, want) < 1e-5
    else:
        assert not isinstance(got, torch.Tensor), f"nn's module raised {want}, ours compiled"
    torch._dynamo.reset()
    assert rel_err(torch.compile(ours)(packed)[0].data, theirs(packed)[0].data) < 1e-5
