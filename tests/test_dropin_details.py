"""Drop-in details of PersistentRNN, PersistentLSTM and PersistentGRU
against nn.RNN, nn.LSTM and nn.GRU on the CPU, beyond what the shared cell
tests (gated_cells.CellTests, test_module.py) check: dropout on packed input,
result dtypes under CPU autocast, ``_flat_weights`` as a list code may
assign or change, packed, expanded and hand-built inputs, gradients of hx
alone, hooks, grad modes, pickling, assigned and shared weights, strides.
Every test compares with nn's module holding the same weights."""

import copy
import io
import pickle
import re
import warnings

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

import torch_prnn
from conftest import devices, rel_err
from gated_cells import check_parity

# nn.LSTM on the CPU says so whenever it runs a projection.
pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")

F64 = torch.float64
BOUND = 1e-12  # float64 against float64: the same maths, other roundings
CELLS = {"rnn": (torch_prnn.PersistentRNN, nn.RNN), "lstm": (torch_prnn.PersistentLSTM, nn.LSTM),
         "gru": (torch_prnn.PersistentGRU, nn.GRU)}


def twins(cell, dtype=F64, **kwargs):
    """(ours, theirs): nn's module of `cell`, and ours converted from it."""
    ours_cls, nn_cls = CELLS[cell]
    theirs = nn_cls(**{"input_size": 4, "hidden_size": 7, **kwargs}, dtype=dtype)
    ours = getattr(ours_cls, f"from_{cell}")(theirs)
    return ours, theirs


def states(h_n):
    """LSTM's (h, c) or GRU's h, as a list."""
    return list(h_n) if isinstance(h_n, tuple) else [h_n]


def values(result):
    """[output (a packed output's data), *final states] of a forward's result."""
    output, h_n = result
    packed = isinstance(output, PackedSequence) or hasattr(output, "batch_sizes")  # a scripted call's namedtuple
    return [output.data if packed else output, *states(h_n)]


def make_hx(module, batch, dtype=F64, requires_grad=True):
    """Random hx of `module` for `batch` sequences: h, or LSTM's (h, c)."""
    layers = module.num_layers * (2 if module.bidirectional else 1)
    sizes = [module.proj_size or module.hidden_size]
    if isinstance(module, (nn.LSTM, torch_prnn.PersistentLSTM)):
        sizes.append(module.hidden_size)
    hx = [torch.randn(layers, batch, size, dtype=dtype, requires_grad=requires_grad) for size in sizes]
    return tuple(hx) if len(hx) == 2 else hx[0]


def weighted_loss(tensors):
    """A loss that weighs every element differently (the same for both modules)."""
    gen = torch.Generator().manual_seed(1)
    return sum((t * torch.randn(t.shape, generator=gen, dtype=F64).to(t)).sum() for t in tensors)


def assert_all_close(got, expected, names, bound=BOUND):
    assert len(got) == len(expected) == len(names)
    for name, a, b in zip(names, got, expected):
        if b is None:
            assert a is None, f"{name}: ours has a gradient, nn's none"
            continue
        assert a is not None, f"{name}: nn has a gradient, ours none"
        assert a.shape == b.shape and a.dtype == b.dtype, f"{name}: {a.shape} {a.dtype} against {b.shape} {b.dtype}"
        err = rel_err(a, b) if b.numel() else 0.0
        assert err < bound, f"{name}: relative error {err:.3g} >= {bound:g}"


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("cell", CELLS)
def test_packed_dropout_matches_nn(cell, bidirectional):
    """In training mode nn draws each layer's dropout mask on the packed data
    ([sum of lengths, features]); from the same seed ours must give nn's
    output, final states and gradients, and leave the generator where nn
    leaves it. (Padded input: gated_cells' test_dropout_train_matches_nn_cpu.)"""
    torch.manual_seed(0)
    ours, theirs = twins(cell, num_layers=3, dropout=0.4, bidirectional=bidirectional)
    x = torch.randn(5, 3, 4, dtype=F64, requires_grad=True)
    lengths = torch.tensor([2, 5, 3])
    results = []
    for module in (ours, theirs):
        torch.manual_seed(11)
        vals = values(module(pack_padded_sequence(x, lengths, enforce_sorted=False)))
        after = torch.rand(4)  # where the call left the generator
        grads = torch.autograd.grad(weighted_loss(vals), [x, *module.parameters()])
        results.append((vals, after, list(grads)))
    (got, got_after, got_grads), (expected, expected_after, expected_grads) = results
    assert_all_close(got, expected, ["output", "h_n", "c_n"][: len(got)])
    assert torch.equal(got_after, expected_after), "the call drew a different amount of randomness than nn's"
    names = ["grad input"] + [f"grad {n}" for n, _ in ours.named_parameters()]
    assert_all_close(got_grads, expected_grads, names)


class PackedCall(nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x: PackedSequence):
        return self.rnn(x)


@pytest.mark.filterwarnings("ignore:`torch.jit.*deprecated:DeprecationWarning")
@pytest.mark.parametrize("cell", CELLS)
def test_packed_dropout_scripted(cell):
    """The scripted module drops the same packed rows as the eager one (and so
    as nn): from one seed the same packed output."""
    torch.manual_seed(0)
    ours, _ = twins(cell, num_layers=2, dropout=0.5, bidirectional=True)
    wrapped = PackedCall(ours)
    scripted = torch.jit.script(copy.deepcopy(wrapped))  # as nn's: one input type a call site
    packed = pack_padded_sequence(torch.randn(5, 3, 4, dtype=F64), torch.tensor([2, 5, 3]), enforce_sorted=False)
    results = []
    for module in (wrapped, scripted):
        torch.manual_seed(5)
        results.append(values(module(packed)))
    assert_all_close(results[1], results[0], ["output", "h_n", "c_n"][: len(results[0])])


def nn_result_or_its_error(run_nn, run_ours):
    """nn's result and ours; where nn's own call raises (oneDNN's bfloat16
    LSTM needs AVX-512 on the CPU: elsewhere nn.LSTM fails under CPU
    autocast), ours must raise the same error, and None is returned."""
    try:
        expected = run_nn()
    except RuntimeError as error:
        with pytest.raises(RuntimeError, match=re.escape(str(error))):
            run_ours()
        return None
    return run_ours(), expected


def _padded():
    return torch.randn(5, 3, 4)


def _unbatched():
    return torch.randn(5, 4)


def _packed():
    return pack_padded_sequence(torch.randn(5, 3, 4), torch.tensor([5, 3, 1]))


AUTOCAST_CASES = [
    # (cell, module options, input): nn.GRU keeps float32 results on the CPU
    # (bfloat16 GEMMs, float32 state); nn.LSTM's oneDNN path (padded, no
    # projection) returns bfloat16, its native path (packed input or
    # proj_size) keeps c_n, and without a projection all results, float32.
    ("gru", {}, _padded),
    ("gru", {}, _unbatched),
    ("gru", dict(num_layers=2, bidirectional=True), _packed),
    ("lstm", dict(num_layers=2, bidirectional=True), _padded),  # the same as nn (bfloat16)
    ("lstm", dict(num_layers=2, bidirectional=True), _packed),
    ("lstm", dict(proj_size=3), _padded),
    ("lstm", dict(proj_size=3, num_layers=2, bidirectional=True), _packed),
]


@pytest.mark.torch_fallback  # as users call: under CPU autocast the modules hand the call to torch
@pytest.mark.parametrize(
    "cell,kwargs,make_input", AUTOCAST_CASES,
    ids=[f"{c}-{'-'.join(k) or 'plain'}-{m.__name__[1:]}" for c, k, m in AUTOCAST_CASES],
)
def test_autocast_cpu_dtypes_match_nn(cell, kwargs, make_input):
    """Under torch.autocast("cpu", bfloat16) a float32 module's output and
    final states have the dtypes nn's give, and nn's values within
    bfloat16's error."""
    torch.manual_seed(0)
    ours, theirs = twins(cell, torch.float32, **kwargs)
    input = make_input()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        results = nn_result_or_its_error(lambda: values(theirs(input)), lambda: values(ours(input)))
    if results is None:
        return
    got, expected = results
    names = ["output", "h_n", "c_n"][: len(got)]
    assert [t.dtype for t in got] == [t.dtype for t in expected], f"dtypes of {names}"
    for name, a, b in zip(names, got, expected):
        assert torch.equal(a, b), f"{name}: not nn's values (the call is nn's own under CPU autocast)"


@pytest.mark.parametrize("cell", CELLS)
def test_flat_weights_can_be_assigned(cell):
    """nn's _flat_weights is the list its forward reads, which code may
    assign or change in place (nn's own _replicate_for_data_parallel
    assigns it); the module then runs on the list as nn's does, until a
    weight attribute is assigned or .to() rebuilds it."""
    torch.manual_seed(0)
    ours, theirs = twins(cell, num_layers=2, bidirectional=True)
    x = torch.randn(5, 3, 4, dtype=F64)
    names = ["output", "h_n", "c_n"][: 2 + (cell == "lstm")]
    theirs._flat_weights = list(theirs._flat_weights)
    ours._flat_weights = list(ours._flat_weights)
    assert_all_close(values(ours(x)), values(theirs(x)), names)

    scaled = 2 * theirs.weight_hh_l1.detach()  # an element of the list changed, not the attribute
    index = theirs._flat_weights_names.index("weight_hh_l1")
    theirs._flat_weights[index] = scaled
    ours._flat_weights[index] = scaled.clone()
    got, expected = values(ours(x)), values(theirs(x))
    assert_all_close(got, expected, names)
    assert rel_err(expected[0], values(theirs.to(F64)(x))[0]) > 1e-3  # .to() rebuilds nn's list: the change is gone
    assert_all_close(values(ours.to(F64)(x)), values(theirs(x)), names)

    for module in (ours, theirs):  # an assigned attribute goes into the list
        module.weight_hh_l1 = nn.Parameter(3 * module.weight_hh_l1.detach())
    assert_all_close(values(ours(x)), values(theirs(x)), names)


@pytest.mark.parametrize("cell", CELLS)
def test_functional_call_runs_the_given_weights(cell):
    """torch.func.functional_call with other weights: the call runs them (the
    list rebuilt, as nn's forward rebuilds it), and the next plain call the
    module's own."""
    torch.manual_seed(0)
    ours, theirs = twins(cell, num_layers=2)
    x = torch.randn(5, 3, 4, dtype=F64)
    names = ["output", "h_n", "c_n"][: 2 + (cell == "lstm")]
    other = {name: torch.randn_like(w) for name, w in theirs.named_parameters()}
    got = values(torch.func.functional_call(ours, other, (x,)))
    expected = values(torch.func.functional_call(theirs, other, (x,)))
    assert_all_close(got, expected, names)
    assert_all_close(values(ours(x)), values(theirs(x)), names)
    assert rel_err(values(ours(x))[0], got[0]) > 1e-3


@pytest.mark.parametrize("dtype", [F64, torch.float32], ids=str)
def test_projection_bidirectional_multilayer_packed(dtype):
    """proj_size with two layers, two directions and unsorted packed input with
    sequences of length 1: outputs, h_n, c_n and every gradient (hx, input,
    parameters) as nn.LSTM's, hx given and absent."""
    torch.manual_seed(0)
    ours = torch_prnn.PersistentLSTM(4, 7, num_layers=2, bidirectional=True, proj_size=3, dtype=dtype)
    reference = nn.LSTM(4, 7, num_layers=2, bidirectional=True, proj_size=3, dtype=F64)
    reference.load_state_dict(ours.state_dict())
    x = torch.randn(5, 4, 4, dtype=dtype, requires_grad=True)
    packed = pack_padded_sequence(x, torch.tensor([1, 5, 1, 3]), enforce_sorted=False)
    check_parity(ours, reference, packed, make_hx(ours, 4, dtype))
    check_parity(ours, reference, packed, None)


@pytest.mark.parametrize("cell", CELLS)
def test_hand_built_packed_sequence_with_an_empty_step(cell):
    """A hand-built PackedSequence whose last step holds no sequence (batch
    sizes [3, 0]), which nn accepts: nn's results."""
    torch.manual_seed(0)
    ours, theirs = twins(cell, bidirectional=True)
    packed = PackedSequence(torch.randn(3, 4, dtype=F64), torch.tensor([3, 0]))
    assert_all_close(values(ours(packed)), values(theirs(packed)), ["output", "h_n", "c_n"][: 2 + (cell == "lstm")])


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("cell", CELLS)
def test_expanded_hx(cell, batch_first):
    """hx given as stride-0 views (a state broadcast over layers and batch):
    nn's results, and the gradients reach the broadcast tensors as nn's do."""
    torch.manual_seed(0)
    ours, theirs = twins(cell, num_layers=2, bidirectional=True, batch_first=batch_first)
    x = torch.randn((3, 5, 4) if batch_first else (5, 3, 4), dtype=F64, requires_grad=True)
    bases = [torch.randn(1, 1, 7, dtype=F64, requires_grad=True) for _ in range(1 + (cell == "lstm"))]
    results = []
    for module in (ours, theirs):
        hx = [base.expand(4, 3, 7) for base in bases]
        vals = values(module(x, tuple(hx) if cell == "lstm" else hx[0]))
        results.append(vals + list(torch.autograd.grad(weighted_loss(vals), [x, *bases])))
    names = ["output", "h_n", "c_n"][: 2 + (cell == "lstm")] + ["grad x"] + ["grad h0", "grad c0"][: len(bases)]
    assert_all_close(results[0], results[1], names)


GRAD_OF = [("lstm", "output"), ("lstm", "h_n"), ("lstm", "c_n"), ("gru", "output"), ("gru", "h_n")]


@pytest.mark.parametrize("cell,loss_of", GRAD_OF, ids=[f"{c}-{w}" for c, w in GRAD_OF])
def test_grad_wrt_hx_only(cell, loss_of):
    """A frozen module, an input without grad, and torch.autograd.grad of a
    loss of one result with respect to hx alone (the other results' grads
    undefined): nn's gradients."""
    torch.manual_seed(0)
    kwargs = dict(num_layers=2, bidirectional=True, **(dict(proj_size=3) if cell == "lstm" else {}))
    ours, theirs = twins(cell, **kwargs)
    x = torch.randn(5, 3, 4, dtype=F64)
    hx = make_hx(ours, 3)
    grads = []
    for module in (ours, theirs):
        module.requires_grad_(False)
        result = dict(zip(["output", "h_n", "c_n"], values(module(x, hx))))
        grads.append(torch.autograd.grad(weighted_loss([result[loss_of]]), states(hx), allow_unused=True))
    assert_all_close(list(grads[0]), list(grads[1]), ["grad h0", "grad c0"][: len(grads[0])])


@pytest.mark.parametrize("cell", CELLS)
def test_tensor_hooks_on_outputs(cell):
    """Hooks on the output (doubling its gradient) and on h_n (zeroing it),
    retain_grad on the output, and .backward(): the input's, the output's and
    every parameter's .grad as nn's."""
    torch.manual_seed(0)
    ours, theirs = twins(cell, num_layers=2)
    x = torch.randn(5, 3, 4, dtype=F64, requires_grad=True)
    results = []
    for module in (ours, theirs):
        output, h_n = module(x)
        output.register_hook(lambda g: 2 * g)
        states(h_n)[0].register_hook(torch.zeros_like)
        output.retain_grad()
        weighted_loss([output, *states(h_n)]).backward()
        results.append([x.grad.clone(), output.grad] + [p.grad for p in module.parameters()])
        x.grad = None
    names = ["grad x", "grad output"] + [f"grad {n}" for n, _ in ours.named_parameters()]
    assert_all_close(results[0], results[1], names)


@pytest.mark.parametrize("cell", CELLS)
def test_module_full_backward_hook(cell):
    """register_full_backward_hook sees nn's grad_input (input, and GRU's hx,
    a tensor argument) and grad_output (the output, a tensor result)."""
    torch.manual_seed(0)
    ours, theirs = twins(cell, num_layers=2)
    x = torch.randn(5, 3, 4, dtype=F64, requires_grad=True)
    hx = make_hx(ours, 3)
    seen = []
    for module in (ours, theirs):
        calls = []
        module.register_full_backward_hook(lambda mod, grad_input, grad_output: calls.append((grad_input, grad_output)))
        weighted_loss(values(module(x, hx))).backward()
        assert len(calls) == 1
        seen.append([*calls[0][0], *calls[0][1]])
    assert_all_close(seen[0], seen[1], [f"hook gradient {i}" for i in range(len(seen[1]))])


@pytest.mark.parametrize("cell", CELLS)
def test_no_grad_and_inference_mode(cell):
    """Under no_grad and inference_mode: nn's values, and results that do
    not require grad (inference tensors under inference_mode)."""
    torch.manual_seed(0)
    ours, theirs = twins(cell, num_layers=2, bidirectional=True)
    x = torch.randn(5, 3, 4, dtype=F64)
    hx = make_hx(ours, 3)
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            got, expected = values(ours(x, hx)), values(theirs(x, hx))
        assert_all_close(got, expected, ["output", "h_n", "c_n"][: len(got)])
        flags = [[(t.requires_grad, t.is_inference()) for t in vals] for vals in (got, expected)]
        assert flags[0] == flags[1], context.__name__


@pytest.mark.parametrize("cell", CELLS)
def test_pickle_deepcopy_and_whole_model_save(cell):
    """pickle, copy.deepcopy and torch.save(module) loaded with torch.load's
    default weights_only=True: the same repr, _flat_weights that are the
    copy's parameters, and the same results."""
    torch.manual_seed(0)
    ours, _ = twins(cell, num_layers=2, bidirectional=True, dropout=0.3, batch_first=True)
    ours.eval()
    buffer = io.BytesIO()
    torch.save(ours, buffer)
    buffer.seek(0)
    copies = [pickle.loads(pickle.dumps(ours)), copy.deepcopy(ours), torch.load(buffer)]
    x = torch.randn(3, 5, 4, dtype=F64)
    expected = values(ours(x))
    for copied in copies:
        assert type(copied) is type(ours) and repr(copied) == repr(ours) and not copied.training
        assert all(a is b for a, b in zip(copied._flat_weights, copied.parameters(), strict=True))
        assert all(torch.equal(a, b) for a, b in zip(values(copied(x)), expected, strict=True))


@pytest.mark.parametrize("cell", CELLS)
def test_assigned_parameters_are_used(cell):
    """A new nn.Parameter assigned to weight_ih_l0 and weight_hh_l1_reverse
    after a first call (two layers, two directions: the regular path) is what
    the next call uses, and gets the gradient, as with nn."""
    torch.manual_seed(0)
    ours, theirs = twins(cell, num_layers=2, bidirectional=True)
    x = torch.randn(5, 3, 4, dtype=F64)
    ours(x), theirs(x)
    new = {name: torch.randn_like(getattr(ours, name)) for name in ("weight_ih_l0", "weight_hh_l1_reverse")}
    results = []
    for module in (ours, theirs):
        for name, value in new.items():
            setattr(module, name, nn.Parameter(value.clone()))
        vals = values(module(x))
        results.append(vals + list(torch.autograd.grad(weighted_loss(vals), [getattr(module, n) for n in new])))
    names = ["output", "h_n", "c_n"][: 2 + (cell == "lstm")] + [f"grad {n}" for n in new]
    assert_all_close(results[0], results[1], names)


@pytest.mark.parametrize("cell", CELLS)
def test_weight_shared_between_directions(cell):
    """One Parameter as both directions' W_hh: nn's results, and its gradient
    the sum over both uses."""
    torch.manual_seed(0)
    ours, theirs = twins(cell, bidirectional=True)
    x = torch.randn(5, 3, 4, dtype=F64)
    results = []
    for module in (ours, theirs):
        module.weight_hh_l0_reverse = module.weight_hh_l0
        vals = values(module(x))
        results.append(vals + list(torch.autograd.grad(weighted_loss(vals), list(module.parameters()))))
    names = ["output", "h_n", "c_n"][: 2 + (cell == "lstm")] + [f"grad {n}" for n, _ in ours.named_parameters()]
    assert_all_close(results[0], results[1], names)


@pytest.mark.parametrize("cell", CELLS)
def test_plain_tensor_weights_as_weight_drop_sets_them(cell):
    """WeightDrop's pattern (torchnlp, fastai): the parameter removed, a raw
    parameter registered, and a plain tensor computed from it set under the
    weight's name: the tensor is used and the raw parameter gets nn's
    gradient."""
    torch.manual_seed(0)
    ours, theirs = twins(cell, num_layers=2)
    x = torch.randn(5, 3, 4, dtype=F64)
    results = []
    for module in (ours, theirs):
        raw = module._parameters.pop("weight_hh_l1")
        module.register_parameter("weight_hh_l1_raw", nn.Parameter(raw.detach().clone()))
        module.weight_hh_l1 = module.weight_hh_l1_raw * 0.5
        vals = values(module(x))
        results.append(vals + list(torch.autograd.grad(weighted_loss(vals), [module.weight_hh_l1_raw])))
    assert_all_close(results[0], results[1], ["output", "h_n", "c_n"][: 2 + (cell == "lstm")] + ["grad raw"])


def test_repr_with_proj_size():
    theirs = nn.LSTM(3, 5, proj_size=2, num_layers=2, bidirectional=True, dropout=0.1)
    ours = torch_prnn.PersistentLSTM.from_lstm(theirs)
    assert repr(ours) == repr(theirs).replace("LSTM(", "PersistentLSTM(", 1)


@pytest.mark.parametrize("cell", CELLS)
def test_dropout_rng_stream_matches_nn(cell):
    """Padded input: a training call draws from the generator what nn's does
    (the next random numbers are nn's), an eval call draws nothing."""
    torch.manual_seed(0)
    ours, theirs = twins(cell, num_layers=3, dropout=0.4, bidirectional=True)
    x = torch.randn(5, 3, 4, dtype=F64)
    for training in (True, False):
        after = []
        for module in (ours, theirs):
            module.train(training)
            torch.manual_seed(5)
            module(x)
            after.append(torch.rand(4))
        assert torch.equal(after[0], after[1]), f"training={training}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("cell", CELLS)
def test_16bit_modules_on_the_cpu(cell, dtype):
    """A module converted with .to(16-bit) on the CPU, as nn's in the same
    dtype: results and gradients in that dtype, each within twice nn's own
    error against the float64 module (and at least 1e-3)."""
    torch.manual_seed(0)
    kwargs = dict(num_layers=2, bidirectional=True, **(dict(proj_size=3) if cell == "lstm" else {}))
    ours, reference = twins(cell, **kwargs)
    theirs = copy.deepcopy(reference).to(dtype)
    ours.to(dtype)
    x = torch.randn(5, 3, 4, dtype=F64)

    def run(module, dtype):
        leaf = x.to(dtype).requires_grad_()
        vals = values(module(leaf))
        return vals + list(torch.autograd.grad(weighted_loss(vals), [leaf, *module.parameters()]))

    got, theirs_got, expected = run(ours, dtype), run(theirs, dtype), run(reference, F64)
    names = ["output", "h_n", "c_n"][: 2 + (cell == "lstm")] + ["grad x"]
    names += [f"grad {n}" for n, _ in ours.named_parameters()]
    for name, a, b, ref in zip(names, got, theirs_got, expected, strict=True):
        assert a.dtype == b.dtype == dtype, name
        bound = max(2 * rel_err(b, ref), 1e-3)
        assert rel_err(a, ref) < bound, f"{name}: {rel_err(a, ref):.3g} >= {bound:.3g}"


GRU_PACKED_BAD = [
    ("input size", lambda: (pack_padded_sequence(torch.randn(5, 3, 6), torch.tensor([5, 3, 2])), None)),
    ("dtype", lambda: (pack_padded_sequence(torch.randn(5, 3, 4, dtype=F64), torch.tensor([5, 3, 2])), None)),
    ("2-D hx", lambda: (pack_padded_sequence(torch.randn(5, 3, 4), torch.tensor([5, 3, 2])), torch.randn(3, 7))),
    ("hx batch", lambda: (pack_padded_sequence(torch.randn(5, 3, 4), torch.tensor([5, 3, 2])), torch.randn(2, 4, 7))),
]


@pytest.mark.parametrize("name,make", GRU_PACKED_BAD, ids=[c[0] for c in GRU_PACKED_BAD])
def test_gru_packed_bad_input_matches_nn(name, make):
    """nn.GRU checks packed input as padded input (check_forward_args): the
    same error type and message. (nn.LSTM does not check packed input: its
    errors come from inside torch and are not compared.)"""
    ours, theirs = twins("gru", torch.float32, num_layers=2)
    input, hx = make()
    with pytest.raises(Exception) as expected:
        theirs(input, hx)
    with pytest.raises(type(expected.value), match=f"^{re.escape(str(expected.value))}$"):
        ours(input, hx)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("cell", CELLS)
def test_result_strides_match_nn(cell, batch_first):
    """The output's and final states' strides are nn's (batch-first output is
    a transposed view in both), so .view() on them works or fails alike."""
    ours, theirs = twins(cell, num_layers=2, bidirectional=True, batch_first=batch_first)
    x = torch.randn(3, 5, 4, dtype=F64)
    assert [t.stride() for t in values(ours(x))] == [t.stride() for t in values(theirs(x))]


@pytest.mark.parametrize("cell", CELLS)
def test_gradcheck(cell):
    """torch.autograd.gradcheck with respect to the input and hx (float64,
    two layers, two directions)."""
    torch.manual_seed(0)
    ours, _ = twins(cell, input_size=2, hidden_size=3, num_layers=2, bidirectional=True)
    x = torch.randn(3, 2, 2, dtype=F64, requires_grad=True)
    hx = states(make_hx(ours, 2))

    def f(x, *hx):
        return tuple(values(ours(x, tuple(hx) if cell == "lstm" else hx[0])))

    assert torch.autograd.gradcheck(f, (x, *hx))


@pytest.mark.torch_fallback
@pytest.mark.parametrize("cell", CELLS)
def test_meta_modules_under_cpu_autocast(cell):
    """A module on the meta device (shapes only, as model-building tools use
    it), plain and under CPU autocast with input of another dtype: nn's
    result shapes and dtypes, where a dtype check that asked for autocast on
    the meta device raised (under autocast the call is nn's: torch runs it,
    whose meta kernels take the mixed dtypes its real ones would cast)."""
    ours_cls, nn_cls = CELLS[cell]
    for dtype, autocast in ((torch.float32, False), (F64, True)):
        x = torch.randn(3, 2, 4, dtype=dtype, device="meta")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            got = values(ours_cls(4, 5, device="meta")(x))
            expected = values(nn_cls(4, 5, device="meta")(x))
        assert [(t.shape, t.dtype, t.device.type) for t in got] == [(t.shape, t.dtype, t.device.type) for t in expected]


@pytest.mark.parametrize("cell", CELLS)
def test_flat_weights_after_an_assigned_attribute(cell):
    """An assigned weight attribute goes into the list, and the next forward
    rebuilds it from the attributes as nn's does: an element changed after
    that forward is kept, one changed before it is dropped."""
    torch.manual_seed(0)
    ours, theirs = twins(cell, num_layers=2)
    x = torch.randn(5, 3, 4, dtype=F64)
    names = ["output", "h_n", "c_n"][: 2 + (cell == "lstm")]
    index = theirs._flat_weights_names.index("weight_hh_l1")
    for module in (ours, theirs):
        module.weight_hh_l0 = nn.Parameter(1.5 * module.weight_hh_l0.detach())
        module(x)
        module._flat_weights[index] = 0 * module.weight_hh_l1.detach()  # after the forward: kept
    assert_all_close(values(ours(x)), values(theirs(x)), names)
    for module in (ours, theirs):
        module._flat_weights[index] = 2 * module.weight_hh_l1.detach()  # then an attribute assigned: dropped
        module.weight_ih_l1 = nn.Parameter(0.5 * module.weight_ih_l1.detach())
    assert_all_close(values(ours(x)), values(theirs(x)), names)


@pytest.mark.parametrize("cell", CELLS)
def test_flat_weights_rebuilt_flattens_as_nn(cell, monkeypatch):
    """A rebuilt list is flattened as nn's (flatten_parameters puts CUDA
    weights in cuDNN's layout for the calls handed to it): the same number of
    flatten_parameters calls as nn's over load_state_dict(assign=True) and a
    forward."""
    torch.manual_seed(0)
    ours, theirs = twins(cell)
    counts = {}
    for module in (ours, theirs):
        flatten = module.flatten_parameters
        monkeypatch.setattr(module, "flatten_parameters", lambda f=flatten, m=module: (
            counts.__setitem__(id(m), counts.get(id(m), 0) + 1), f())[1])
        module.load_state_dict({k: v.clone() for k, v in theirs.state_dict().items()}, assign=True)
        module(torch.randn(5, 3, 4, dtype=F64))
    assert counts[id(ours)] == counts[id(theirs)] >= 1


@pytest.mark.parametrize("cell", CELLS)
def test_functional_call_after_a_failed_conversion(cell):
    """A conversion that fails part way (.to(), .half() and the like run
    _apply) leaves the list in step: functional_call still runs the weights
    it is given (nn's list is left without its references there, and
    functional_call raises)."""
    torch.manual_seed(0)
    ours, theirs = twins(cell)
    converted = []

    def fail_on_the_second(t):
        converted.append(t)
        if len(converted) > 1:
            raise RuntimeError("conversion failed")
        return t.clone()

    with pytest.raises(RuntimeError, match="conversion failed"):
        ours._apply(fail_on_the_second)
    x = torch.randn(5, 3, 4, dtype=F64)
    other = {name: torch.randn_like(w) for name, w in theirs.named_parameters()}
    expected = values(torch.func.functional_call(copy.deepcopy(theirs), other, (x,)))
    assert_all_close(values(torch.func.functional_call(ours, other, (x,))), expected,
                     ["output", "h_n", "c_n"][: 2 + (cell == "lstm")])


@pytest.mark.torch_fallback  # as users call
@pytest.mark.parametrize("cell", CELLS)
def test_torch_func_grad_where_torch_runs_the_call(cell):
    """torch.func.grad works on a call handed to torch's recurrence (here: under
    CPU autocast), giving nn's gradients; on torch_prnn's ops it is refused
    with one clear error (they do not support torch.func's autodiff)."""
    torch.manual_seed(0)
    ours, theirs = twins(cell, torch.float32)
    x = torch.randn(5, 3, 4)

    def loss(module, x=x):
        return lambda p: torch.func.functional_call(module, p, (x,))[0].float().sum()

    with torch.autocast("cpu", dtype=torch.bfloat16):
        results = nn_result_or_its_error(lambda: torch.func.grad(loss(theirs))(dict(theirs.named_parameters())),
                                         lambda: torch.func.grad(loss(ours))(dict(ours.named_parameters())))
    if results is not None:
        got, expected = results
        for name in expected:
            assert torch.equal(got[name], expected[name]), name
    short = torch.randn(2, 3, 4)  # a training call ours keeps on the CPU: two steps
    with pytest.raises(RuntimeError, match="does not support torch.func's autodiff"):
        torch.func.grad(loss(ours, short))(dict(ours.named_parameters()))


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_batched_gradients_of_the_final_state_alone(cell, packed):
    """torch.autograd.grad(h_n, x, is_grads_batched=True) - what
    jacobian(vectorize=True) and gradcheck(check_batched_grad=True) run -
    with no gradient for the output: nn's gradients (the output's zeros were
    made unbatched, and adding the batched h_n gradient into them failed)."""
    torch.manual_seed(0)
    ours, theirs = twins(cell)
    x = torch.randn(6, 5, 4, dtype=F64, requires_grad=True)
    lengths = torch.tensor([6, 5, 3, 3, 1])
    grad_h = torch.randn(3, 1, 5, 7, dtype=F64)
    grads = []
    for module in (ours, theirs):
        inputs = pack_padded_sequence(x, lengths, enforce_sorted=False) if packed else x
        h_n = states(module(inputs)[1])[0]
        grads.append(torch.autograd.grad(h_n, x, grad_h, is_grads_batched=True)[0])
    assert rel_err(grads[0], grads[1]) < BOUND


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_rnn_computes_by_its_mode_as_nn(bidirectional, packed):
    """nn.RNN's forward reads the activation from mode, not nonlinearity
    (which only sets mode at construction): changing either attribute
    afterwards, ours computes what nn computes; from_rnn copies mode; an
    unknown mode raises nn's error."""
    torch.manual_seed(0)
    ours, theirs = twins("rnn", bidirectional=bidirectional)
    x = torch.randn(5, 3, 4, dtype=F64)
    inputs = pack_padded_sequence(x, torch.tensor([5, 4, 2])) if packed else x
    for attribute, value in (("nonlinearity", "relu"), ("mode", "RNN_RELU"), ("nonlinearity", "tanh")):
        setattr(ours, attribute, value)
        setattr(theirs, attribute, value)
        for a, b in zip(values(ours(inputs)), values(theirs(inputs))):
            assert rel_err(a, b) < BOUND, (attribute, value)
        copied = torch_prnn.PersistentRNN.from_rnn(theirs)
        assert copied.mode == theirs.mode
        assert rel_err(values(copied(inputs))[0], values(theirs(inputs))[0]) < BOUND
    ours.mode = theirs.mode = "GRU"
    with pytest.raises(AssertionError, match="mode must be RNN_TANH or RNN_RELU, got GRU"):
        theirs(inputs)
    with pytest.raises(AssertionError, match="mode must be RNN_TANH or RNN_RELU, got GRU"):
        ours(inputs)


@pytest.mark.parametrize("cell", CELLS)
def test_conversion_keeps_frozen_parameters_frozen(cell):
    """from_rnn / from_lstm / from_gru copy each parameter's requires_grad
    (load_state_dict copies values only)."""
    nn_cls = CELLS[cell][1]
    theirs = nn_cls(4, 7, num_layers=2, dtype=F64)
    theirs.weight_hh_l0.requires_grad_(False)
    theirs.bias_ih_l1.requires_grad_(False)
    ours = getattr(CELLS[cell][0], f"from_{cell}")(theirs)
    flags = {name: p.requires_grad for name, p in theirs.named_parameters()}
    assert {name: p.requires_grad for name, p in ours.named_parameters()} == flags
    assert not flags["weight_hh_l0"] and flags["weight_ih_l0"]


def test_gru_infinite_state_as_nn():
    """An infinite h0 entry whose update gate saturates at 1: nn.GRU's
    n + z (h - n) keeps the infinity, where lerp's other form for z >= 0.5
    gave NaN (the ATen CPU path; the C reference computes (1 - z) n + z h)."""
    for seed in range(40):
        torch.manual_seed(seed)
        ours, theirs = twins("gru", input_size=3, hidden_size=3)
        x = torch.randn(2, 1, 3, dtype=F64)
        h0 = torch.randn(1, 1, 3, dtype=F64)
        h0[0, 0, 0] = float("inf")
        for a, b in zip(values(ours(x, h0)), values(theirs(x, h0))):
            assert torch.allclose(a, b, equal_nan=True), seed


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("cell", CELLS)
def test_final_states_are_not_views(cell, grad, packed):
    """h_n (and c_n) are tensors of their own, as nn's are, not views: code
    that detaches the carried state in place (truncated backpropagation
    through time) runs on ours as on nn's, with the same gradients after."""
    for layers, bidirectional in ((1, False), (2, False), (1, True)):
        ours, theirs = twins(cell, num_layers=layers, bidirectional=bidirectional)
        x = torch.randn(5, 3, 4, dtype=F64)
        if packed:
            x = pack_padded_sequence(x, torch.tensor([5, 4, 2]))
        grads = []
        for module in ours, theirs:
            with torch.set_grad_enabled(grad):
                output, h_n = module(x)
            finals = states(h_n)
            assert [s._is_view() for s in finals] == [False] * len(finals), (type(module).__name__, layers)
            for s in finals:
                s.detach_()
            if grad:
                grads.append(torch.autograd.grad(weighted_loss([values((output, h_n))[0]]), list(module.parameters())))
        if grad:
            assert_all_close(grads[0], grads[1], ours._flat_weights_names)


@pytest.mark.parametrize("cell", CELLS)
def test_nn_helper_methods(cell):
    """nn.RNNBase's public helpers (and nn.LSTM's for c) answer as nn's do:
    code written against nn's modules may call them."""
    ours, theirs = twins(cell, num_layers=2, bidirectional=True, **({"proj_size": 3} if cell == "lstm" else {}))
    x = torch.randn(5, 3, 4, dtype=F64)
    batch_sizes = torch.tensor([3, 3, 2, 1])
    for args in ((x, None), (x[:, 0], batch_sizes)):
        assert ours.get_expected_hidden_size(*args) == theirs.get_expected_hidden_size(*args)
        if cell == "lstm":
            assert ours.get_expected_cell_size(*args) == theirs.get_expected_cell_size(*args)
    good, bad = make_hx(theirs, 3, requires_grad=False), make_hx(theirs, 2, requires_grad=False)
    assert ours.check_forward_args(x, good, None) is None
    calls = [lambda m: m.check_forward_args(x, bad, None), lambda m: m.check_input(x.float(), None),
             lambda m: m.check_input(x[0, 0], None), lambda m: m.check_hidden_size(x, (1, 2, 3))]
    for call in calls:
        with pytest.raises(Exception) as expected:
            call(theirs)
        with pytest.raises(type(expected.value), match=f"^{re.escape(str(expected.value))}$"):
            call(ours)
    order = torch.tensor([2, 0, 1])
    for a, b in zip(states(ours.permute_hidden(good, order)), states(theirs.permute_hidden(good, order))):
        assert torch.equal(a, b)
    assert ours.permute_hidden(good, None) is good


@pytest.mark.parametrize("device", devices)
@pytest.mark.parametrize("cell", CELLS)
def test_conversion_leaves_random_state_and_warns_once(cell, device):
    """from_rnn / from_lstm / from_gru copy a module: they draw nothing from
    the caller's generators (a seeded script's next dropout mask or shuffle
    is the one it would be with nn's module), and the options' warning is
    nn's, at the module's construction, not repeated by the conversion."""
    ours_cls, nn_cls = CELLS[cell]
    with pytest.warns(UserWarning, match="dropout option adds dropout"):
        theirs = nn_cls(4, 7, dropout=0.5, bidirectional=True, device=device)
    torch.manual_seed(1234)
    expected = (torch.rand(3), torch.rand(3, device=device))
    torch.manual_seed(1234)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = getattr(ours_cls, f"from_{cell}")(theirs)
    assert torch.equal(torch.rand(3), expected[0])
    assert torch.equal(torch.rand(3, device=device), expected[1])
    for name, weight in theirs.named_parameters():
        assert torch.equal(getattr(ours, name), weight), name
