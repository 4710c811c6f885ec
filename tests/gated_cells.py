"""The tests PersistentLSTM and PersistentGRU share, against nn.LSTM and
nn.GRU with the same weights: CellTests, which test_lstm_module.py and
test_gru_module.py subclass with their cell (pytest collects the subclasses,
not this file).

Every check compares outputs, final states and every gradient (input, each
state of hx, each parameter) with the nn module in float64. In float32 the
bound is torch's own float32 error: nn's float32 module on the same weights
and inputs, against the same float64 reference."""

import copy
import itertools
import random
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from conftest import devices, needs_cuda, rel_err

DTYPES = [torch.float64, torch.float32]
FLOAT64_BOUND = 1e-12
# float32: within this many times nn's own float32 error, and never asked
# below FLOAT32_FLOOR (some 17 roundings: on a tiny case nn can be all but
# exact). Observed on the CPU: ours at most 6.7e-7, and at most 3.7 times nn's
# where nn's exceeds 1e-7 (GRU's grad h0, H = 129).
FLOAT32_FACTOR, FLOAT32_FLOOR = 4.0, 2e-6


def tensors(hx):
    """hx or h_n as a list: LSTM's (h, c), GRU's h alone, none for None."""
    if hx is None:
        return []
    return list(hx) if isinstance(hx, tuple) else [hx]


def leaf_copy(x, dtype):
    """A contiguous leaf copy in `dtype` of a tensor, of LSTM's (h, c), or of
    a PackedSequence's data (cuDNN refuses strided hx)."""
    if x is None:
        return None
    if isinstance(x, PackedSequence):
        return PackedSequence(leaf_copy(x.data, dtype), x.batch_sizes, x.sorted_indices, x.unsorted_indices)
    if isinstance(x, tuple):
        return tuple(leaf_copy(t, dtype) for t in x)
    return x.detach().to(dtype, memory_format=torch.contiguous_format, copy=True).requires_grad_()


def run(module, input, hx):
    """[output, *final states] and the gradients of a random loss of them all
    with respect to [*hx, input, *parameters]."""
    output, h_n = module(input, hx)
    values = [output.data if isinstance(output, PackedSequence) else output] + tensors(h_n)
    gen = torch.Generator().manual_seed(1)
    loss = sum((t * torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t)).sum() for t in values)
    leaves = tensors(hx) + [input.data if isinstance(input, PackedSequence) else input]
    grads = torch.autograd.grad(loss, leaves + list(module.parameters()))
    return output, values, list(grads)


def check_parity(ours, reference, input, hx):
    """`ours` against `reference`, the nn module in float64 with the same
    weights; in float32 within FLOAT32_FACTOR of nn's own float32 error."""
    dtype = ours.weight_ih_l0.dtype
    output, values, grads = run(ours, input, hx)
    ref_output, ref_values, ref_grads = run(reference, leaf_copy(input, torch.float64), leaf_copy(hx, torch.float64))
    if isinstance(ref_output, PackedSequence):
        for field in ("batch_sizes", "sorted_indices", "unsorted_indices"):
            a, b = getattr(output, field), getattr(ref_output, field)
            assert (a is None and b is None) or torch.equal(a, b), field
    state_names = ["h_n", "c_n"][: len(values) - 1]
    names = ["output", *state_names]
    names += [f"grad {n}" for n in ["h0", "c0"][: len(tensors(hx))]] + ["grad input"]
    names += [f"grad {n}" for n, _ in ours.named_parameters()]
    if dtype == torch.float64:
        bounds = [FLOAT64_BOUND] * len(names)
    else:
        theirs = copy.deepcopy(reference).to(dtype)  # exact: the weights are ours, widened
        _, their_values, their_grads = run(theirs, leaf_copy(input, dtype), leaf_copy(hx, dtype))
        bounds = [
            max(FLOAT32_FACTOR * rel_err(t, r), FLOAT32_FLOOR)
            for t, r in zip(their_values + their_grads, ref_values + ref_grads, strict=True)
        ]
    pairs = zip(names, values + grads, ref_values + ref_grads, bounds, strict=True)
    for name, got, expected, bound in pairs:
        assert got.shape == expected.shape and got.dtype == dtype, name
        err = rel_err(got, expected)
        assert err < bound, f"{name}: relative error {err:.3g} >= {bound:.3g}"


def make_input(T, B, I, batch_first, dtype, device):
    shape = (B, T, I) if batch_first else (T, B, I)
    return torch.randn(shape, dtype=dtype, device=device, requires_grad=True)


OPTIONS = list(itertools.product([1, 2], [True, False], [False, True], [False, True]))


class CellTests:
    """Tests of one cell; a subclass names it. `ours`: the torch_prnn module,
    `theirs`: the nn module, `proj_sizes`: the proj_size values the options
    test runs (LSTM only has projections)."""

    ours: type
    theirs: type
    proj_sizes = (0,)

    @pytest.fixture(autouse=True)
    def true_fp32(self):
        """float32 everywhere, in cuDNN's RNN kernels and cuBLAS too (TF32
        off): nn's float32 error is then a float32 error."""
        saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        yield
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved

    # ---- helpers

    def twins(self, device="cpu", dtype=torch.float64, **kwargs):
        """Ours in `dtype`, and the nn module in float64 with the same
        weights: the reference."""
        kwargs = {"input_size": 4, "hidden_size": 7, **kwargs}
        ours = self.ours(**kwargs, device=device, dtype=dtype)
        reference = self.theirs(**kwargs, device=device, dtype=torch.float64)
        reference.load_state_dict(ours.state_dict())
        return ours, reference

    def make_hx(self, module, B, device):
        """Random hx for `module` and a batch of B: h, or LSTM's (h, c)."""
        dtype, layers = module.weight_ih_l0.dtype, module.num_layers * (2 if module.bidirectional else 1)
        states = [
            torch.randn(layers, B, size, dtype=dtype, device=device, requires_grad=True)
            for size in module._state_sizes
        ]
        return tuple(states) if len(states) == 2 else states[0]

    def hx_of(self, h):
        """hx with `h` as its first state (LSTM adds a c of h's shape)."""
        return h

    # ---- parity with nn, by option and size

    @pytest.mark.parametrize("device", devices)
    @pytest.mark.parametrize("dtype", DTYPES, ids=str)
    @pytest.mark.parametrize("num_layers,bias,batch_first,bidirectional", OPTIONS)
    def test_options(self, device, dtype, num_layers, bias, batch_first, bidirectional):
        for proj_size in self.proj_sizes:
            ours, reference = self.twins(
                device, dtype, num_layers=num_layers, bias=bias, batch_first=batch_first,
                bidirectional=bidirectional, **({"proj_size": proj_size} if proj_size else {}),
            )
            x = make_input(6, 3, 4, batch_first, dtype, device)
            check_parity(ours, reference, x, self.make_hx(ours, 3, device))
            check_parity(ours, reference, x, None)

    @pytest.mark.parametrize("device", devices)
    @pytest.mark.parametrize("dtype", DTYPES, ids=str)
    @pytest.mark.parametrize("T,B,H", [(1, 1, 1), (5, 2, 7), (4, 3, 33), (3, 2, 129), (1, 4, 33), (7, 1, 7)])
    def test_sizes(self, device, dtype, T, B, H):
        ours, reference = self.twins(device, dtype, input_size=5, hidden_size=H, num_layers=2, bidirectional=True)
        x = make_input(T, B, 5, False, dtype, device)
        check_parity(ours, reference, x, self.make_hx(ours, B, device))

    @needs_cuda
    @pytest.mark.parametrize("dtype", DTYPES, ids=str)
    @pytest.mark.parametrize("H", [640, 1024])
    @pytest.mark.parametrize("bidirectional", [False, True])
    def test_large_sizes_cuda(self, dtype, H, bidirectional):
        ours, reference = self.twins("cuda", dtype, input_size=64, hidden_size=H, num_layers=2, bidirectional=bidirectional)
        x = make_input(16, 4, 64, False, dtype, "cuda")
        check_parity(ours, reference, x, self.make_hx(ours, 4, "cuda"))

    @pytest.mark.parametrize("device", devices)
    @pytest.mark.parametrize("batch_first", [False, True])
    def test_non_contiguous(self, device, batch_first):
        dtype = torch.float64
        ours, reference = self.twins(device, dtype, num_layers=2, batch_first=batch_first, bidirectional=True)
        T, B = 5, 3
        # A slice of a larger buffer, and a view with batch and time swapped.
        sliced = torch.randn(T + 3, 2 * B, 11, dtype=dtype, device=device)[2 : T + 2, ::2, 3:7]
        swapped = torch.randn(B, T, 4, dtype=dtype, device=device).transpose(0, 1)
        if batch_first:  # B x T x 4: the same slice, and time-major memory
            sliced = sliced.transpose(0, 1)
            swapped = torch.randn(T, B, 4, dtype=dtype, device=device).transpose(0, 1)
        # Each state a strided view with layers and batch swapped.
        states = [
            torch.randn(B, 4, 2 * size, dtype=dtype, device=device)[:, :, ::2].transpose(0, 1)
            for size in ours._state_sizes
        ]
        for x in (sliced, swapped):
            x = x.detach().requires_grad_()
            hx = [state.detach().requires_grad_() for state in states]
            assert not x.is_contiguous() and not any(state.is_contiguous() for state in hx)
            check_parity(ours, reference, x, tuple(hx) if len(hx) == 2 else hx[0])

    @pytest.mark.parametrize("device", devices)
    @pytest.mark.parametrize("batch_first", [False, True])
    def test_unbatched(self, device, batch_first):
        dtype = torch.float64
        ours, reference = self.twins(device, dtype, num_layers=2, batch_first=batch_first, bidirectional=True)
        x = torch.randn(5, 4, dtype=dtype, device=device, requires_grad=True)
        hx = self.make_hx(ours, 1, device)
        unbatched_hx = tuple(h[:, 0] for h in hx) if isinstance(hx, tuple) else hx[:, 0]
        check_parity(ours, reference, x, unbatched_hx)
        check_parity(ours, reference, x, None)
        output, h_n = ours(x)
        assert output.shape == (5, 14) and all(h.shape == (4, 7) for h in tensors(h_n))

    @pytest.mark.parametrize("device", devices)
    @pytest.mark.parametrize("dtype", DTYPES, ids=str)
    @pytest.mark.parametrize("enforce_sorted", [True, False])
    @pytest.mark.parametrize("bidirectional", [False, True])
    def test_packed(self, device, dtype, enforce_sorted, bidirectional):
        ours, reference = self.twins(device, dtype, num_layers=2, bidirectional=bidirectional)
        lengths = torch.tensor([6, 4, 4, 1]) if enforce_sorted else torch.tensor([3, 6, 1, 4])
        x = torch.randn(6, 4, 4, dtype=dtype, device=device, requires_grad=True)
        packed = pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
        check_parity(ours, reference, packed, self.make_hx(ours, 4, device))
        check_parity(ours, reference, packed, None)
        # Round trip as users write it: padded output in the original batch order.
        padded, out_lengths = pad_packed_sequence(ours(packed)[0])
        assert torch.equal(out_lengths, lengths) and padded.shape == (6, 4, 7 * (1 + bidirectional))

    @pytest.mark.parametrize("device", devices)
    def test_zero_batch(self, device):
        ours, reference = self.twins(device, torch.float64, num_layers=2, bidirectional=True)
        x = torch.randn(5, 0, 4, dtype=torch.float64, device=device, requires_grad=True)
        (o1, h1), (o2, h2) = ours(x), reference(x)
        assert o1.shape == o2.shape == (5, 0, 14)
        assert [h.shape for h in tensors(h1)] == [h.shape for h in tensors(h2)]
        grads = torch.autograd.grad(o1.sum() + sum(h.sum() for h in tensors(h1)), [x, *ours.parameters()])
        assert grads[0].shape == x.shape and all((g == 0).all() for g in grads[1:])

    # ---- dropout

    @pytest.mark.parametrize("device", devices)
    def test_dropout_eval_is_exact(self, device):
        """In eval mode dropout is off: the same as nn without dropout (in
        training mode, as cuDNN's RNN backward requires)."""
        ours, reference = self.twins(device, torch.float64, num_layers=3, dropout=0.5, bidirectional=True)
        ours.eval()
        reference.dropout = 0.0
        check_parity(ours, reference, make_input(5, 3, 4, False, torch.float64, device), None)

    @pytest.mark.parametrize("bidirectional", [False, True])
    def test_dropout_train_matches_nn_cpu(self, bidirectional):
        """On the CPU nn draws its masks between layers with the dropout that
        F.dropout runs, on tensors of the same shape: from the same seed,
        the same masks, so outputs and gradients match nn's."""
        ours, reference = self.twins("cpu", torch.float64, num_layers=3, dropout=0.4, bidirectional=bidirectional)
        x = make_input(5, 3, 4, False, torch.float64, "cpu")
        torch.manual_seed(11)
        got = run(ours, x, None)
        torch.manual_seed(11)
        expected = run(reference, x, None)
        assert not torch.equal(got[1][0], run(ours.eval(), x, None)[1][0])  # the masks matter
        for name, a, b in zip(["output", "h_n"], got[1], expected[1]):
            assert rel_err(a, b) < FLOAT64_BOUND, name
        for a, b in zip(got[2], expected[2], strict=True):
            assert rel_err(a, b) < FLOAT64_BOUND

    @pytest.mark.parametrize("device", devices)
    def test_dropout_train_between_layers(self, device):
        """Training mode, any device: a 2-layer module is its two layers
        with F.dropout between them, drawn from the same seed; the last
        layer's output is not dropped, and each call draws a fresh mask."""
        p = 0.5
        stack = self.ours(4, 16, num_layers=2, dropout=p, device=device, dtype=torch.float64)
        first = self.ours(4, 16, device=device, dtype=torch.float64)
        second = self.ours(16, 16, device=device, dtype=torch.float64)
        first.load_state_dict({k: v for k, v in stack.state_dict().items() if k.endswith("l0")})
        second.load_state_dict({k.replace("l1", "l0"): v for k, v in stack.state_dict().items() if k.endswith("l1")})
        x = torch.randn(6, 3, 4, dtype=torch.float64, device=device)
        torch.manual_seed(5)
        got = stack(x)[0]
        torch.manual_seed(5)
        expected = second(F.dropout(first(x)[0], p, training=True))[0]
        assert torch.equal(got, expected)
        assert not torch.equal(stack(x)[0], got)
        assert torch.equal(stack.eval()(x)[0], second(first(x)[0])[0])

    # ---- gradients

    def test_distinct_parameter_grads(self):
        """Each parameter's gradient is its own tensor (LSTM's b_ih and b_hh
        have equal gradients: they must still not share storage), from
        torch.autograd.grad and in .grad."""
        ours, _ = self.twins(num_layers=2, bidirectional=True)
        x = make_input(4, 2, 4, False, torch.float64, "cpu")
        output, h_n = ours(x, self.make_hx(ours, 2, "cpu"))
        loss = output.sum() + sum(h.sum() for h in tensors(h_n))
        params = list(ours.parameters())
        grads = torch.autograd.grad(loss, params, retain_graph=True)
        assert len({g.untyped_storage().data_ptr() for g in grads}) == len(params)
        loss.backward()
        assert len({p.grad.untyped_storage().data_ptr() for p in params}) == len(params)

    def test_weight_norm_parametrization(self):
        """A parametrized weight (weight_norm) is what the layer uses, and its
        gradient reaches the parametrization's own parameters, as with nn."""
        ours, reference = self.twins(bidirectional=True)
        for module in (ours, reference):
            torch.nn.utils.parametrizations.weight_norm(module, "weight_hh_l0_reverse")
            with torch.no_grad():  # a non-trivial scale, so that using the raw weight would show
                module.parametrizations.weight_hh_l0_reverse.original0.mul_(0.5)
        check_parity(ours, reference, make_input(5, 3, 4, False, torch.float64, "cpu"), None)

    def test_autocast_cpu(self):
        """Under autocast(bfloat16), on torch_prnn's ops (the hand-over off, as in
        every test not marked torch_fallback), a float32 module runs them in
        bfloat16, within bfloat16's error of the float64 reference. Users'
        calls go to torch's recurrence there, whose dtypes nn's are
        (test_dropin_details.test_autocast_cpu_dtypes_match_nn)."""
        ours, reference = self.twins(dtype=torch.float32, num_layers=2)
        x = torch.randn(6, 3, 4)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output, h_n = ours(x)
        expected, expected_h_n = reference(x.double())
        for got, ref in zip([output, *tensors(h_n)], [expected, *tensors(expected_h_n)], strict=True):
            assert got.dtype == torch.bfloat16 and rel_err(got, ref) < 1e-2

    # ---- the nn interface

    def test_same_parameters_and_init_as_nn(self):
        for proj_size in self.proj_sizes:
            kwargs = dict(input_size=3, hidden_size=5, num_layers=2, bidirectional=True)
            kwargs.update({"proj_size": proj_size} if proj_size else {})
            torch.manual_seed(7)
            ours = self.ours(**kwargs)
            torch.manual_seed(7)
            theirs = self.theirs(**kwargs)
            assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
            for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
                assert a.shape == b.shape and torch.equal(a, b), name
            # State dicts both ways, and the attributes nn code reads.
            theirs.load_state_dict(ours.state_dict())
            ours.load_state_dict(theirs.state_dict())
            for name in ("mode", "proj_size", "_flat_weights_names", "_all_weights"):
                assert getattr(ours, name) == getattr(theirs, name), name
            for a, b in zip(ours._flat_weights, theirs._flat_weights, strict=True):
                assert a.shape == b.shape and torch.equal(a, b)
            assert [[p.shape for p in ps] for ps in ours.all_weights] == [
                [p.shape for p in ps] for ps in theirs.all_weights
            ]
            ours.flatten_parameters()  # accepted, like nn's

    def test_state_dict_round_trip(self):
        ours, _ = self.twins(num_layers=2, bidirectional=True, bias=False)
        theirs = self.theirs(4, 7, num_layers=2, bidirectional=True, bias=False, dtype=torch.float64)
        theirs.load_state_dict(ours.state_dict())
        back = self.ours(4, 7, num_layers=2, bidirectional=True, bias=False, dtype=torch.float64)
        back.load_state_dict(theirs.state_dict())
        for (name, a), (_, b) in zip(ours.state_dict().items(), back.state_dict().items(), strict=True):
            assert torch.equal(a, b), name
        x = torch.randn(3, 2, 4, dtype=torch.float64)
        assert torch.equal(back(x)[0], ours(x)[0])

    @pytest.mark.parametrize(
        "kwargs", [{}, dict(num_layers=2, bias=False, batch_first=True, dropout=0.25, bidirectional=True)]
    )
    def test_repr_and_from_nn(self, kwargs):
        theirs = self.theirs(3, 5, **kwargs).double().eval()
        convert = getattr(self.ours, f"from_{self.theirs.__name__.lower()}")
        ours = convert(theirs)
        assert repr(ours) == repr(theirs).replace(f"{self.theirs.__name__}(", f"{self.ours.__name__}(", 1)
        assert not ours.training and ours.weight_hh_l0.dtype == torch.float64
        x = torch.randn(4, 2, 3, dtype=torch.float64)
        assert rel_err(ours(x)[0], theirs(x)[0]) < FLOAT64_BOUND
        assert convert(theirs.train()).training
        other = torch.nn.GRU if self.theirs is torch.nn.LSTM else torch.nn.LSTM
        expected = f"from_{self.theirs.__name__.lower()} expects a torch.nn.{self.theirs.__name__}, got {other.__name__}"
        with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
            convert(other(3, 5))
        with pytest.raises(TypeError, match=f"expects a torch.nn.{self.theirs.__name__}, got Linear$"):
            convert(torch.nn.Linear(3, 5))

    @pytest.mark.parametrize(
        "args,kwargs",
        [
            ((3, 5), dict(dropout=1.5)),
            ((3, 5), dict(dropout=True)),
            ((3, 5), dict(bias=1)),
            ((3, 5), dict(batch_first="yes")),
            ((3.0, 5), {}),
            ((0, 5), {}),
            ((3, 5.0), {}),
            ((3, 0), {}),
            ((3, 5, 0), {}),
            ((3, 5), dict(proj_size=-1)),
            ((3, 5), dict(proj_size=5)),
            ((3, 5), dict(proj_size=0)),  # GRU refuses any proj_size; LSTM builds
        ],
    )
    def test_constructor_errors_match_nn(self, args, kwargs):
        try:
            self.theirs(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - compared below
            with pytest.raises(type(error), match=f"^{re.escape(str(error))}$"):
                self.ours(*args, **kwargs)
        else:
            self.ours(*args, **kwargs)

    def test_dropout_warning_matches_nn(self):
        with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
            self.ours(3, 5, dropout=0.5)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            self.ours(3, 5, num_layers=2, dropout=0.5)

    BAD_CALLS = [
        ("wrong dtype", lambda self: (torch.randn(5, 3, 4, dtype=torch.float64), None)),
        ("wrong rank", lambda self: (torch.randn(5, 3, 4, 1), None)),
        ("wrong input_size", lambda self: (torch.randn(5, 3, 6), None)),
        ("hx shape", lambda self: (torch.randn(5, 3, 4), self.hx_of(torch.randn(4, 2, 7)))),
        ("hx rank, batched", lambda self: (torch.randn(5, 3, 4), self.hx_of(torch.randn(4, 7)))),
        ("hx rank, unbatched", lambda self: (torch.randn(5, 4), self.hx_of(torch.randn(4, 1, 7)))),
        ("empty sequence", lambda self: (torch.randn(0, 3, 4), None)),
        ("empty unbatched sequence", lambda self: (torch.randn(0, 4), None)),
    ]

    @pytest.mark.parametrize("device", devices)
    @pytest.mark.parametrize("name,make", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
    def test_bad_calls_match_nn(self, device, name, make):
        self.check_bad_call(device, *make(self))

    def check_bad_call(self, device, input, hx):
        """nn's error and message for this call, then a good call still works."""
        ours, reference = self.twins(device, torch.float32, num_layers=2, bidirectional=True)
        theirs = copy.deepcopy(reference).float()  # the same dtype: it is in one of the messages
        input = input.to(device)
        hx = None if hx is None else tuple(t.to(device) for t in hx) if isinstance(hx, tuple) else hx.to(device)
        with pytest.raises(Exception) as expected:
            theirs(input, hx)
        with pytest.raises(type(expected.value), match=f"^{re.escape(str(expected.value))}$"):
            ours(input, hx)
        x = torch.randn(5, 3, 4, device=device)
        assert rel_err(ours(x)[0], reference(x.double())[0]) < 1e-5

    @pytest.mark.parametrize("device", devices)
    def test_packed_hx_shape_checked(self, device):
        """A packed batch with hx for another batch: nn's message (nn.LSTM
        itself does not check it), not an out-of-range permutation."""
        ours, _ = self.twins(device, torch.float64)
        packed = pack_padded_sequence(torch.randn(5, 3, 4, dtype=torch.float64, device=device), [2, 5, 3], enforce_sorted=False)
        what = "hidden[0]" if len(ours._state_sizes) == 2 else "hidden"
        with pytest.raises(RuntimeError, match=re.escape(f"Expected {what} size (1, 3, 7), got [1, 2, 7]")):
            ours(packed, self.hx_of(torch.randn(1, 2, 7, dtype=torch.float64, device=device)))

    def test_func_autodiff_refused(self):
        ours, _ = self.twins()
        x = torch.randn(3, 2, 4, dtype=torch.float64)
        with pytest.raises(RuntimeError, match=f"^{self.ours.__name__} does not support torch.func's autodiff"):
            torch.func.grad(lambda x: ours(x)[0].sum())(x)

    # ---- torch.compile and torch.export

    def test_compile_fullgraph_dynamic(self):
        """A small module call under torch.compile(fullgraph=True,
        dynamic=True): eager's outputs and gradients, and a second shape
        without a recompile. One bidirectional layer: both directions' code,
        and an inductor compile CI can afford."""
        from torch._dynamo.testing import CompileCounterWithBackend

        torch._dynamo.reset()
        try:
            ours = self.ours(4, 8, bidirectional=True, batch_first=True, dtype=torch.float64)
            counter = CompileCounterWithBackend("inductor")
            compiled = torch.compile(ours, fullgraph=True, dynamic=True, backend=counter)

            def check(batch, steps):
                x = torch.randn(batch, steps, 4, dtype=torch.float64, requires_grad=True)
                hx = self.make_hx(ours, batch, "cpu")
                _, got_values, got_grads = run(compiled, x, hx)
                _, values, grads = run(ours, x, hx)
                for a, b in zip(got_values + got_grads, values + grads, strict=True):
                    assert rel_err(a, b) < FLOAT64_BOUND

            check(3, 5)
            compiles = counter.frame_count
            check(2, 7)
            assert counter.frame_count == compiles  # symbolic batch and steps: no recompile
        finally:
            torch._dynamo.reset()

    def test_export(self):
        ours = self.ours(4, 8, num_layers=2, bidirectional=True, batch_first=True).eval()
        batch, steps = torch.export.Dim("batch"), torch.export.Dim("steps")
        program = torch.export.export(ours, (torch.randn(3, 5, 4),), dynamic_shapes={"input": {0: batch, 1: steps}})
        assert f"prnn.{self.theirs.__name__.lower()}" in str(program.graph)  # the op, kept whole
        for shape in [(3, 5, 4), (2, 7, 4)]:
            x = torch.randn(shape)
            got, expected = program.module()(x), ours(x)
            for a, b in zip([got[0], *tensors(got[1])], [expected[0], *tensors(expected[1])], strict=True):
                assert rel_err(a, b) < 1e-6

    # ---- randomized

    @pytest.mark.parametrize("device", devices)
    def test_random_configuration(self, device):
        """A configuration and data from a fresh seed each run (printed, so a
        failure can be replayed with that seed)."""
        seed = random.SystemRandom().randrange(2**31)
        rng = random.Random(seed)
        torch.manual_seed(seed)
        hidden = rng.choice([1, 2, 3, 8, 17, 40])
        kwargs = dict(
            input_size=rng.randint(1, 9),
            hidden_size=hidden,
            num_layers=rng.randint(1, 3),
            bias=rng.random() < 0.7,
            batch_first=rng.random() < 0.5,
            bidirectional=rng.random() < 0.5,
        )
        if max(self.proj_sizes) and hidden > 1 and rng.random() < 0.5:
            kwargs["proj_size"] = rng.randint(1, hidden - 1)
        dtype = rng.choice(DTYPES)
        T, B = rng.randint(1, 8), rng.randint(1, 5)
        packed = rng.random() < 0.4
        with_hx = rng.random() < 0.5
        print(f"seed {seed}: {kwargs}, {dtype}, T={T} B={B} packed={packed} hx={with_hx}")
        ours, reference = self.twins(device, dtype, **kwargs)
        x = make_input(T, B, kwargs["input_size"], kwargs["batch_first"], dtype, device)
        if packed:
            lengths = torch.tensor([rng.randint(1, T) for _ in range(B)])
            x = pack_padded_sequence(x, lengths, batch_first=kwargs["batch_first"], enforce_sorted=False)
        check_parity(ours, reference, x, self.make_hx(ours, B, device) if with_hx else None)
