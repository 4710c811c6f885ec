"""The fake (meta) kernels check what the real kernels check: for every
prnn:: op, each tensor argument of a valid call changed in rank, in each
size, or in dtype, and the nonlinearity changed: the op on the CPU, the same
call under FakeTensorMode (what torch.compile and export trace with) and on
the meta device either all succeed or all raise the same exception type and
message. Values (lengths in [0, steps]) are data, which only the real kernels
read, so lengths keep valid values."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_prnn  # noqa: F401 (registers the ops)

P = torch.ops.prnn
T, B, H, I, PROJ = 5, 3, 4, 2, 3


def _r(*shape):
    return torch.randn(*shape)


def _lstm_saved(proj):
    w_hr = _r(PROJ, H) if proj else None
    state = PROJ if proj else H
    y, _, _, saved = P.lstm(_r(T, B, 4 * H), _r(4 * H), _r(B, state), _r(B, H), _r(4 * H, state), w_hr, None, True)
    return y, saved, w_hr, state


def _calls():
    """(name, op, args): valid calls of every op, with and without optional inputs."""
    lengths = torch.tensor([5, 2, 0])
    calls = []
    for lens in (None, lengths):
        tag = "lengths" if lens is not None else "padded"
        calls.append((f"forward {tag}", P.forward, [_r(T, B, H), _r(B, H), _r(H, H), lens, "tanh"]))
        calls.append((f"layer {tag}", P.layer, [_r(T, B, I), _r(H, I), _r(H), _r(H), _r(B, H), _r(H, H), lens, "relu"]))
        y, _ = P.forward(_r(T, B, H), _r(B, H), _r(H, H), lens, "tanh")
        calls.append((f"backward {tag}", P.backward, [_r(T, B, H), y, _r(B, H), _r(H, H), lens, "tanh", True]))
        for proj in (False, True):
            w_hr = _r(PROJ, H) if proj else None
            state = PROJ if proj else H
            calls.append((f"lstm {tag} proj={proj}", P.lstm,
                          [_r(T, B, 4 * H), _r(4 * H), _r(B, state), _r(B, H), _r(4 * H, state), w_hr, lens, True]))
            y, saved, w_hr, state = _lstm_saved(proj)
            calls.append((f"lstm_backward {tag} proj={proj}", P.lstm_backward,
                          [_r(T, B, state), _r(B, state), _r(B, H), _r(B, state), _r(B, H), y, saved, _r(4 * H, state),
                           w_hr, lens]))
        calls.append((f"gru {tag}", P.gru, [_r(T, B, 3 * H), _r(3 * H), _r(B, H), _r(3 * H, H), lens, True]))
        y, _, saved = P.gru(_r(T, B, 3 * H), _r(3 * H), _r(B, H), _r(3 * H, H), None, True)
        calls.append((f"gru_backward {tag}", P.gru_backward,
                      [_r(T, B, H), _r(B, H), _r(B, H), y, saved, _r(3 * H, H), lens]))
    return calls


def _changes(args):
    """(what, args) for each change of one argument of a valid call."""
    for i, a in enumerate(args):
        if isinstance(a, str):
            yield f"arg {i} = 'sigmoid'", args[:i] + ["sigmoid"] + args[i + 1:]
        if isinstance(a, bool):
            yield f"arg {i} = {not a}", args[:i] + [not a] + args[i + 1:]
        if not isinstance(a, torch.Tensor):
            continue
        lengths = a.dtype == torch.int64  # the only integer argument of a valid call
        variants = [("rank - 1", a[0] if a.dim() > 0 else a.view(1)), ("rank + 1", a.unsqueeze(0))]
        variants += [(f"size {d} + 1", torch.cat([a, a.narrow(d, 0, 1)], d)) for d in range(a.dim()) if a.shape[d] > 0]
        variants += [(f"size {d} = 0", a.narrow(d, 0, 0)) for d in range(a.dim())]
        if lengths:
            variants = [(w, v.clamp(0, T)) for w, v in variants] + [("int32", a.int())]
        else:
            variants += [("float64", a.double()), ("float16", a.half()), ("int64", a.long())]
        for what, v in variants:
            yield f"arg {i} {what}", args[:i] + [v] + args[i + 1:]


def _outcome(op, args):
    """'ok' and the outputs' shapes and dtypes, or the error's type and message."""
    try:
        outputs = op(*args)
        return "ok " + str([(tuple(t.shape), t.dtype) for t in outputs])
    except (RuntimeError, ValueError, TypeError, IndexError) as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"


def _fake_outcome(op, args):
    mode = FakeTensorMode()
    with mode:
        fakes = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        return _outcome(op, fakes)


def _meta_outcome(op, args):
    # lengths stay on the CPU (like nn's batch_sizes), as the real kernels require.
    names = [a.name for a in op.default._schema.arguments]
    metas = [a.to("meta") if isinstance(a, torch.Tensor) and name != "lengths" else a for name, a in zip(names, args)]
    return _outcome(op, metas)


CALLS = _calls()


def _data_check(outcome):
    """The real kernels' check of lengths' values (in [0, steps]), which a
    fake kernel cannot make: it sees no data."""
    return "lengths must be in [0, steps=" in outcome


@pytest.mark.parametrize("name,op,args", CALLS, ids=[c[0] for c in CALLS])
def test_fake_kernels_raise_what_the_real_kernels_raise(name, op, args):
    """One argument changed at a time; a call that runs gives the real
    kernels' output shapes and dtypes."""
    assert _outcome(op, args) == _fake_outcome(op, args) == _meta_outcome(op, args)
    assert _outcome(op, args).startswith("ok")
    checked = 0
    for what, changed in _changes(args):
        real = _outcome(op, changed)
        if _data_check(real):
            continue
        assert _fake_outcome(op, changed) == real, (what, real)
        assert _meta_outcome(op, changed) == real, (what, real)
        checked += not real.startswith("ok")
    assert checked >= 10  # the changes reach the checks


@pytest.mark.parametrize("name,op,args", CALLS, ids=[c[0] for c in CALLS])
def test_fake_kernels_check_devices(name, op, args):
    """One tensor argument on the meta device, the others on the CPU: the
    dispatcher runs the fake kernel, which names the argument whose device
    differs (lengths: that it must be on the CPU) instead of returning."""
    names = [a.name for a in op.default._schema.arguments]
    for i, (arg_name, a) in enumerate(zip(names, args)):
        if not isinstance(a, torch.Tensor):
            continue
        moved = args[:i] + [a.to("meta")] + args[i + 1:]
        expected = "lengths must be a CPU tensor" if arg_name == "lengths" else "must be on the device of"
        with pytest.raises(RuntimeError, match=expected):
            op(*moved)


ELMAN_CALLS = [c for c in CALLS if c[0].split()[0] in ("forward", "layer", "backward")]


@pytest.mark.parametrize("name,op,args", ELMAN_CALLS, ids=[c[0] for c in ELMAN_CALLS])
def test_fake_kernels_check_in_the_real_kernels_order(name, op, args):
    """Two arguments changed at once: the first check that fails is the
    real kernels' first (the Elman ops; their checks are the ones the gated
    ops' follow)."""
    changes = list(_changes(args))
    for i, (what_a, changed_a) in enumerate(changes):
        for what_b, changed_b in changes[i + 1:]:
            index_a, index_b = int(what_a.split()[1]), int(what_b.split()[1])
            if index_a == index_b:
                continue
            both = list(changed_a)
            both[index_b] = changed_b[index_b]
            real = _outcome(op, both)
            if not _data_check(real):
                assert _fake_outcome(op, both) == real, (what_a, what_b, real)


def test_fake_kernels_take_unbacked_sizes():
    """Sizes known only when the graph runs (a boolean mask's rows) are
    checked by runtime asserts, not guards, which such sizes cannot have:
    the compiled call runs and gives eager's result."""
    torch._dynamo.reset()
    w = _r(H, H)

    def f(x, h_all, rows, states):
        return torch.ops.prnn.forward(x[:, rows], h_all[states], w, None, "tanh")

    x, h_all = _r(T, 6, H), _r(6, H)
    rows = torch.tensor([True, False, True, True, False, False])
    states = rows.flip(0)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, h_all, rows, states)
    torch._dynamo.reset()
    for a, b in zip(got, f(x, h_all, rows, states), strict=True):
        assert torch.equal(a, b)
