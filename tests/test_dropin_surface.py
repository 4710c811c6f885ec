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
from conftest import Batched, assert_close, devices, twins

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
            assert torch.equal(a.batch_sizes, b.batch_sizes)
            a, b = a.data, b.data
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


@script_tests
def test_script_twice_and_save_load(tmp_path):
    """Scripting twice in one process (the same model, then another one), and
    scripted models saved with torch.jit.save and loaded back, as nn.RNN's are."""
    rnn = torch_prnn.PersistentRNN(4, 7, num_layers=2, bidirectional=True)
    other = torch_prnn.PersistentRNN(4, 3, nonlinearity="relu")
    first, second = torch.jit.script(Batched(rnn)), torch.jit.script(Batched(rnn))
    scripted_other, scripted_packed = torch.jit.script(Batched(other)), torch.jit.script(Packed(rnn))
    x = torch.randn(5, 3, 4)
    assert_same(first(x), rnn(x))
    assert_same(second(x), rnn(x))
    assert_same(scripted_other(x), other(x))
    torch.jit.save(first, tmp_path / "batched.pt")
    torch.jit.save(scripted_packed, tmp_path / "packed.pt")
    loaded, loaded_packed = torch.jit.load(tmp_path / "batched.pt"), torch.jit.load(tmp_path / "packed.pt")
    assert_same(loaded(x), rnn(x))
    sequence = pack_padded_sequence(x, torch.tensor([5, 2, 1]))
    assert_same(loaded_packed(sequence), rnn(sequence))


# ---- torch.compile(fullgraph=True) with PackedSequence input ----------------


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def packed_outputs_and_grads(model, x, lengths, enforce_sorted, hx=None):
    """The packed output's data, h_n, and their gradients with respect to x
    and the parameters; x is packed here, per call, as a training step does."""
    output, h_n = model(pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted), hx)
    loss = output.data.square().sum() + h_n.sin().sum()
    return [output.data, h_n, *torch.autograd.grad(loss, [x, *model.parameters()])]


@pytest.mark.parametrize("device", devices)
def test_compile_packed_fullgraph(device, fresh_dynamo):
    """Under the default backend, sorted packed input without hx, where the
    batch is only in batch_sizes' data: eager's output, and no recompile for
    other batches and lengths."""
    model = torch_prnn.PersistentRNN(4, 6, bidirectional=True, device=device)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=counter)
    compiles = None
    for steps, lengths in [(5, [5, 3, 2]), (4, [4, 4, 3, 1])]:
        packed = pack_padded_sequence(torch.randn(steps, len(lengths), 4, device=device), torch.tensor(lengths))
        with torch.no_grad():
            got, expected = compiled(packed), model(packed)
        assert_close(got[0].data, expected[0].data, torch.float32, f"output at lengths {lengths}")
        assert_close(got[1], expected[1], torch.float32, f"h_n at lengths {lengths}")
        compiles = compiles or counter.frame_count
    assert counter.frame_count == compiles


@pytest.mark.parametrize("device", devices)
def test_compile_packed_gradients(device, fresh_dynamo):
    """Packed input sorted and not, hx absent and given: eager's outputs and
    gradients."""
    model = torch_prnn.PersistentRNN(4, 6, num_layers=2, bidirectional=True, device=device)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(5, 3, 4, device=device, requires_grad=True)
    hx = torch.randn(4, 3, 6, device=device)
    for lengths, enforce_sorted, h in [([5, 3, 2], True, None), ([5, 3, 2], True, hx), ([3, 5, 2], False, hx)]:
        got = packed_outputs_and_grads(compiled, x, torch.tensor(lengths), enforce_sorted, h)
        expected = packed_outputs_and_grads(model, x, torch.tensor(lengths), enforce_sorted, h)
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("device", devices)
def test_compile_packed_bad_input(device, fresh_dynamo):
    """A hand-built PackedSequence that does not fit hx, or whose batch_sizes
    are malformed: an error when the compiled graph runs."""
    model = torch_prnn.PersistentRNN(4, 6, num_layers=2, bidirectional=True, device=device)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    data = torch.randn(10, 4, device=device)
    hx = torch.randn(4, 3, 6, device=device)
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
def test_script_refuses_computed_weights(parametrize):
    """A weight computed by a parametrization cannot be scripted (nor can
    nn.RNN's): one clear error at script time, naming the supported paths,
    never a scripted model running on the raw weight."""
    rnn = torch_prnn.PersistentRNN(4, 7)
    parametrize(rnn, "weight_hh_l0")
    with pytest.raises(RuntimeError, match=r"\['weight_hh_l0'\] are computed .* torch.compile and torch.export do"):
        torch.jit.script(Batched(rnn))
