"""Python side of the prnn:: ops (defined in csrc/ops): fake kernels for
torch.compile / export, the backward ops' (refused) gradients, autocast, and
the plan query."""

import torch
from torch import Tensor

from . import _crossover
from ._recurrent import check_batch_sizes_type

_TIERS = ("none", "cpu_reference", "persistent_registers", "persistent_shared", "stepwise", "persistent_cluster",
          "persistent_cluster_grid", "few_steps")


# The real kernels' shape, dtype, device and nonlinearity checks
# (csrc/ops/prnn_ops.cpp: check_problem, check_input_projection,
# check_gated_forward / _backward, host_lengths), in their order, with their
# messages and exception types, on sizes that may be symbolic, so that
# tracing or a meta call fails where running would. Values (lengths in
# [0, steps]) are data, which only the real kernels check.
_FLOAT_TYPES = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16"}


_OTHER_TYPES = {torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
                torch.uint8: "Byte", torch.uint16: "UInt16", torch.uint32: "UInt32", torch.uint64: "UInt64",
                torch.bool: "Bool", torch.complex32: "ComplexHalf", torch.complex64: "ComplexFloat",
                torch.complex128: "ComplexDouble"}
_OTHER_TYPES.update({getattr(torch, name): name.capitalize() for name in dir(torch)
                     if name.startswith("float8_") and isinstance(getattr(torch, name), torch.dtype)})


def _type_name(dtype):
    """A dtype as the C++ checks print it (c10's ScalarType names)."""
    return _FLOAT_TYPES.get(dtype) or _OTHER_TYPES.get(dtype) or str(dtype).replace("torch.", "")


def _check_rank(op, name, t, rank, dims):
    torch._check(t.dim() == rank, lambda: f"{op}: {name} must be {rank}-D {dims}, got {t.dim()}-D {list(t.shape)}")


def _check_float(op, name, t):
    torch._check(
        t.dtype in _FLOAT_TYPES,
        lambda: f"{op}: {name} must be float32, float64, float16 or bfloat16, got {_type_name(t.dtype)}",
    )


def _check_like(op, name, t, ref_name, ref):
    """check_like's: t has ref's dtype and device. The fake kernel is also
    the meta kernel, which the dispatcher picks whenever any argument is on
    the meta device: unchecked, a meta h0 beside a CPU xp would return an
    uninitialised CPU tensor."""
    torch._check(
        t.dtype == ref.dtype,
        lambda: f"{op}: {name} must have the dtype of {ref_name} ({_type_name(ref.dtype)}), got {_type_name(t.dtype)}",
    )
    torch._check(
        t.device == ref.device, lambda: f"{op}: {name} must be on the device of {ref_name} ({ref.device}), got {t.device}"
    )


def _check_same_sizes(t, shape, message):
    """t's sizes are `shape`: one torch._check a size, so that a symbolic size
    becomes a runtime assert, not a guard (an unbacked one cannot be guarded)."""
    torch._check(t.dim() == len(shape), message)
    for size, expected in zip(t.shape, shape):
        torch._check(size == expected, message)


def _check_shape(op, name, t, shape, words):
    """t's sizes are `shape`; words: the expected shape as the message says it."""
    _check_same_sizes(t, shape, lambda: f"{op}: {name} must have shape {words}, got {list(t.shape)}")


def _check_grad_y(op, grad_y, y):
    _check_like(op, "grad_y", grad_y, "y", y)
    _check_same_sizes(
        grad_y, y.shape, lambda: f"{op}: grad_y must have the shape of y {list(y.shape)}, got {list(grad_y.shape)}"
    )


def _check_lengths(op, lengths, batch):
    """host_lengths': on the CPU, int64, [batch]."""
    if lengths is None:
        return
    torch._check(
        lengths.device.type == "cpu",
        lambda: f"{op}: lengths must be a CPU tensor (like nn.RNN's batch_sizes), got one on {lengths.device}",
    )
    torch._check(lengths.dtype == torch.int64, lambda: f"{op}: lengths must be int64, got {_type_name(lengths.dtype)}")
    _check_shape(op, "lengths", lengths, (batch,), f"[batch={batch}]")


def _check_nonlinearity(op, nonlinearity):
    torch._check_value(
        nonlinearity in ("tanh", "relu"), lambda: f"{op}: nonlinearity must be 'tanh' or 'relu', got '{nonlinearity}'"
    )


def _check_problem(op, x_name, x, h0, w_hh, nonlinearity, sizes=None):
    """check_problem's: h0 [B, H] and w_hh [H, H] against x [T, B, H] (sizes
    gives them where x is not that: a layer's x [T, B, I]). Returns (T, B, H).
    lengths are checked after every other argument, as host_lengths runs."""
    if sizes is None:
        _check_rank(op, x_name, x, 3, "[steps, batch, hidden]")
    _check_float(op, x_name, x)
    _check_rank(op, "h0", h0, 2, "[batch, hidden]")
    _check_rank(op, "w_hh", w_hh, 2, "[hidden, hidden]")
    _check_like(op, "h0", h0, x_name, x)
    _check_like(op, "w_hh", w_hh, x_name, x)
    steps, batch, hidden = sizes if sizes is not None else x.shape
    _check_shape(op, "h0", h0, (batch, hidden), f"[batch={batch}, hidden={hidden}]")
    _check_shape(op, "w_hh", w_hh, (hidden, hidden), f"[hidden={hidden}, hidden={hidden}]")
    _check_nonlinearity(op, nonlinearity)
    return steps, batch, hidden


def _check_batch_sizes_meta(batch_sizes, batch, rows):
    """What the packed ops check of batch_sizes without reading its values."""
    if not (isinstance(batch, torch.SymInt) or isinstance(rows, torch.SymInt)) and (batch < 0 or rows < 0):
        raise ValueError(f"PackedSequence: the batch and the number of data rows must be >= 0, got {batch} and {rows}")
    check_batch_sizes_type(batch_sizes)
    if batch_sizes.device.type != "cpu":
        raise RuntimeError(f"PackedSequence: batch_sizes must be on the CPU, got one on {batch_sizes.device}")


@torch.library.register_fake("prnn::packed_rows")
def _packed_rows_fake(batch_sizes, batch, rows, pin_memory=False):
    _check_batch_sizes_meta(batch_sizes, batch, rows)
    # int64 whatever batch_sizes' integer dtype, as the op returns them.
    return batch_sizes.new_empty(batch, dtype=torch.int64), batch_sizes.new_empty(rows, dtype=torch.int64)


@torch.library.register_fake("prnn::check_packed")
def _check_packed_fake(batch_sizes, batch, rows):
    _check_batch_sizes_meta(batch_sizes, batch, rows)


@torch.library.register_fake("prnn::forward")
def _forward_fake(xp, h0, w_hh, lengths, nonlinearity):
    steps, batch, hidden = _check_problem("prnn::forward", "xp", xp, h0, w_hh, nonlinearity)
    _check_lengths("prnn::forward", lengths, batch)
    return _outputs(xp, steps, batch, hidden)


def _outputs(like, steps, batch, hidden):
    """y [steps, batch, hidden] and h_n [batch, hidden]: two contiguous
    tensors, as the real kernels return them."""
    return like.new_empty((steps, batch, hidden)), like.new_empty((batch, hidden))


def _check_input_projection(op, x, w_ih, b_ih, b_hh, rows="hidden"):
    """check_input_projection's: x [T, B, I], w_ih [rows, I], both biases or neither [rows]."""
    _check_rank(op, "x", x, 3, "[steps, batch, input]")
    _check_float(op, "x", x)
    _check_rank(op, "w_ih", w_ih, 2, f"[{rows}, input]")
    _check_like(op, "w_ih", w_ih, "x", x)
    torch._check(
        w_ih.shape[1] == x.shape[2],
        lambda: f"{op}: w_ih must have shape [{rows}, input={x.shape[2]}], got {list(w_ih.shape)}",
    )
    torch._check((b_ih is None) == (b_hh is None), lambda: f"{op}: b_ih and b_hh must both be tensors or both be None")
    for name, b in (("b_ih", b_ih), ("b_hh", b_hh)):
        if b is not None:
            _check_rank(op, name, b, 1, f"[{rows}]")
            _check_like(op, name, b, "x", x)
            _check_shape(op, name, b, (w_ih.shape[0],), f"[{rows}={w_ih.shape[0]}]")


@torch.library.register_fake("prnn::layer")
def _layer_fake(x, w_ih, b_ih, b_hh, h0, w_hh, lengths, nonlinearity):
    _check_input_projection("prnn::layer", x, w_ih, b_ih, b_hh)
    steps, batch, hidden = x.shape[0], x.shape[1], w_ih.shape[0]
    # The recurrence's with prnn::forward's messages, as the real kernels raise them (xp is on x's device).
    _check_problem("prnn::forward", "xp", x, h0, w_hh, nonlinearity, (steps, batch, hidden))
    _check_lengths("prnn::forward", lengths, batch)
    return _outputs(x, steps, batch, hidden)


@torch.library.register_fake("prnn::backward")
def _backward_fake(grad_y, y, h0, w_hh, lengths, nonlinearity, h0_grad=True):
    op = "prnn::backward"
    _check_problem(op, "y", y, h0, w_hh, nonlinearity)
    _check_grad_y(op, grad_y, y)
    _check_lengths(op, lengths, y.shape[1])
    return y.new_empty(y.shape), h0.new_empty(h0.shape if h0_grad else (0,)), w_hh.new_empty(w_hh.shape)


# A gated cell's gates a unit and values the forward saves a unit (cells.cuh).
_GATED = {"prnn::lstm": (4, 5), "prnn::gru": (3, 4), "prnn::lstm_backward": (4, 5), "prnn::gru_backward": (3, 4)}


def _check_projection(op, w_hr, ref_name, ref, hidden):
    """check_projection's: w_hr [P, H]; returns P (0 without one)."""
    if w_hr is None:
        return 0
    _check_rank(op, "w_hr", w_hr, 2, "[proj_size, hidden]")
    _check_like(op, "w_hr", w_hr, ref_name, ref)
    torch._check(hidden >= 1, lambda: f"{op}: a projection (w_hr) needs hidden >= 1, got hidden 0")
    message = lambda: f"{op}: w_hr must have shape [proj_size >= 1, hidden={hidden}], got {list(w_hr.shape)}"  # noqa: E731
    torch._check(w_hr.shape[0] >= 1, message)
    torch._check(w_hr.shape[1] == hidden, message)
    return w_hr.shape[0]


def _check_state(op, name, t, ref_name, ref, batch, width_name, width):
    _check_rank(op, name, t, 2, f"[batch, {width_name}]")
    _check_like(op, name, t, ref_name, ref)
    _check_shape(op, name, t, (batch, width), f"[batch={batch}, {width_name}={width}]")


def _check_w_hh(op, w_hh, gates, rows, hidden, state_name, state):
    _check_shape(op, "w_hh", w_hh, (gates * hidden, state), f"[{rows}={gates * hidden}, {state_name}={state}]")


def _check_gated_forward(op, xp, b_hh, h0, c0, w_hh, w_hr, lengths):
    """check_gated_forward's; returns (T, B, H, S): S the state's width (P or H)."""
    gates, _ = _GATED[op]
    rows, state_name = f"{gates}*hidden", "proj_size" if w_hr is not None else "hidden"
    _check_rank(op, "xp", xp, 3, f"[steps, batch, {rows}]")
    _check_float(op, "xp", xp)
    _check_rank(op, "w_hh", w_hh, 2, f"[{rows}, {state_name}]")
    _check_like(op, "w_hh", w_hh, "xp", xp)
    steps, batch = xp.shape[0], xp.shape[1]
    torch._check(
        xp.shape[2] % gates == 0,
        lambda: f"{op}: xp must have shape [steps, batch, {rows}]: its last size must be a multiple of {gates}, "
        f"got {list(xp.shape)}",
    )
    hidden = xp.shape[2] // gates
    proj = _check_projection(op, w_hr, "xp", xp, hidden)
    state = proj if w_hr is not None else hidden
    _check_state(op, "h0", h0, "xp", xp, batch, state_name, state)
    if c0 is not None:
        _check_state(op, "c0", c0, "xp", xp, batch, "hidden", hidden)
    _check_w_hh(op, w_hh, gates, rows, hidden, state_name, state)
    if b_hh is not None:
        _check_rank(op, "b_hh", b_hh, 1, f"[{rows}]")
        _check_like(op, "b_hh", b_hh, "xp", xp)
        _check_shape(op, "b_hh", b_hh, (gates * hidden,), f"[{rows}={gates * hidden}]")
    _check_lengths(op, lengths, batch)
    return steps, batch, hidden, state


def _check_gated_backward(op, grad_y, grad_h_n, grad_c_n, h0, c0, y, saved, w_hh, w_hr, lengths):
    """check_gated_backward's; returns (T, B, H)."""
    gates, saved_values = _GATED[op]
    rows, state_name = f"{gates}*hidden", "proj_size" if w_hr is not None else "hidden"
    _check_rank(op, "y", y, 3, f"[steps, batch, {state_name}]")
    _check_float(op, "y", y)
    _check_grad_y(op, grad_y, y)
    _check_rank(op, "w_hh", w_hh, 2, f"[{rows}, {state_name}]")
    _check_like(op, "w_hh", w_hh, "y", y)
    torch._check(
        w_hh.shape[0] % gates == 0,
        lambda: f"{op}: w_hh must have shape [{rows}, {state_name}]: its first size must be a multiple of "
        f"{gates}, got {list(w_hh.shape)}",
    )
    steps, batch, hidden = y.shape[0], y.shape[1], w_hh.shape[0] // gates
    proj = _check_projection(op, w_hr, "y", y, hidden)
    state = proj if w_hr is not None else hidden
    torch._check(
        y.shape[2] == state, lambda: f"{op}: y must have shape [steps, batch, {state_name}={state}], got {list(y.shape)}"
    )
    _check_w_hh(op, w_hh, gates, rows, hidden, state_name, state)
    _check_state(op, "h0", h0, "y", y, batch, state_name, state)
    if c0 is not None:
        _check_state(op, "c0", c0, "y", y, batch, "hidden", hidden)
    _check_rank(op, "saved", saved, 3, "[steps, batch, saved values*hidden]")
    _check_like(op, "saved", saved, "y", y)
    _check_shape(
        op, "saved", saved, (steps, batch, saved_values * hidden),
        f"[steps={steps}, batch={batch}, {saved_values}*hidden={saved_values * hidden}] (the forward's, with save=True)",
    )
    if grad_h_n is not None:
        _check_state(op, "grad_h_n", grad_h_n, "y", y, batch, state_name, state)
    if grad_c_n is not None:
        _check_state(op, "grad_c_n", grad_c_n, "y", y, batch, "hidden", hidden)
    _check_lengths(op, lengths, batch)
    return steps, batch, hidden


@torch.library.register_fake("prnn::lstm")
def _lstm_fake(xp, b_hh, h0, c0, w_hh, w_hr, lengths, save=False):
    op = "prnn::lstm"
    steps, batch, hidden, state = _check_gated_forward(op, xp, b_hh, h0, c0, w_hh, w_hr, lengths)
    saved = xp.new_empty((steps, batch, 5 * hidden) if save else (0,))
    return xp.new_empty((steps, batch, state)), xp.new_empty((batch, state)), xp.new_empty((batch, hidden)), saved


@torch.library.register_fake("prnn::gru")
def _gru_fake(xp, b_hh, h0, w_hh, lengths, save=False):
    op = "prnn::gru"
    steps, batch, hidden, _ = _check_gated_forward(op, xp, b_hh, h0, None, w_hh, None, lengths)
    saved = xp.new_empty((steps, batch, 4 * hidden) if save else (0,))
    return xp.new_empty((steps, batch, hidden)), xp.new_empty((batch, hidden)), saved


@torch.library.register_fake("prnn::gated_layer")
def _gated_layer_fake(x, w_ih, b_ih, b_hh, h0, c0, w_hh, mode):
    # gated_layer_forward's checks: its own, the GEMM's, then prnn::lstm's or prnn::gru's on xp.
    op = "prnn::gated_layer"
    torch._check_value(mode in ("LSTM", "GRU"), lambda: f"{op}: mode must be 'LSTM' or 'GRU', got '{mode}'")
    torch._check((c0 is not None) == (mode == "LSTM"), lambda: f"{op}: c0 must be given for an LSTM and only for one")
    _check_input_projection(op, x, w_ih, b_ih, b_hh, "4*hidden" if mode == "LSTM" else "3*hidden")
    xp = torch.nn.functional.linear(x, w_ih, b_ih)
    if mode == "LSTM":
        y, h_n, c_n, _ = _lstm_fake(xp, b_hh, h0, c0, w_hh, None, None)
        return y, h_n, c_n
    y, h_n, _ = _gru_fake(xp, b_hh, h0, w_hh, None)
    return y, h_n, x.new_empty((0,))


@torch.library.register_fake("prnn::lstm_backward")
def _lstm_backward_fake(grad_y, grad_h_n, grad_c_n, h0, c0, y, saved, w_hh, w_hr, lengths):
    op = "prnn::lstm_backward"
    steps, batch, hidden = _check_gated_backward(op, grad_y, grad_h_n, grad_c_n, h0, c0, y, saved, w_hh, w_hr,
                                                 lengths)
    return (
        y.new_empty((steps, batch, 4 * hidden)),
        y.new_empty(h0.shape),
        y.new_empty(c0.shape),
        y.new_empty(w_hh.shape),
        y.new_empty((4 * hidden,)),
        y.new_empty(w_hr.shape if w_hr is not None else (0,)),
    )


@torch.library.register_fake("prnn::gru_backward")
def _gru_backward_fake(grad_y, grad_h_n, h0, y, saved, w_hh, lengths):
    op = "prnn::gru_backward"
    steps, batch, hidden = _check_gated_backward(op, grad_y, grad_h_n, None, h0, None, y, saved, w_hh, None,
                                                 lengths)
    return (
        y.new_empty((steps, batch, 3 * hidden)),
        y.new_empty(h0.shape),
        y.new_empty(w_hh.shape),
        y.new_empty((3 * hidden,)),
    )


def _refuse_double_backward(op):
    """Registered as the backward ops' gradient so that the gradient of a
    gradient fails with this message instead of silently treating the op as a
    constant."""

    def double_backward(ctx, *grads):
        raise RuntimeError(
            f"{op}: double backward (a gradient of a gradient) through torch_prnn's RNN is not supported"
        )

    return double_backward


# The forward ops' autograd is registered in C++ (csrc/ops/prnn_autograd.cpp):
# their backwards call the backward ops, whose gradient is this error.
for _name in ("backward", "lstm_backward", "gru_backward"):
    torch.library.register_autograd(f"prnn::{_name}", _refuse_double_backward(f"prnn::{_name}"))


# Autocast: run the ops in the active autocast dtype, as nn.RNN does (its
# input GEMM and recurrence). torch.library.register_autocast casts to one
# fixed dtype, which would turn bfloat16 autocast into float16, so the rule is
# registered directly.
_lib = torch.library.Library("prnn", "IMPL")


def _register_autocast(name: str, device_type: str) -> None:
    op = getattr(torch.ops.prnn, name).default

    def cast(t):
        # Autocast's rule: floating tensors of this device, float64 excepted
        # (lengths, int64 on the CPU, and None pass through).
        eligible = isinstance(t, Tensor) and t.is_floating_point() and t.dtype != torch.float64
        if eligible and t.device.type == device_type:
            return t.to(torch.get_autocast_dtype(device_type))
        return t

    def autocast_rule(*args):
        with torch.autocast(device_type, enabled=False):
            return op(*[cast(a) for a in args])

    _lib.impl(name, autocast_rule, "Autocast" + device_type.upper())


for _device_type in ("cpu", "cuda"):
    if torch.amp.is_autocast_available(_device_type):
        for _name in ("forward", "layer", "lstm", "gru", "gated_layer"):
            _register_autocast(_name, _device_type)


def plan(
    hidden_size: int,
    batch: int = 1,
    steps: int = 1,
    dtype: torch.dtype = torch.float32,
    device="cpu",
    nonlinearity: str = "tanh",
    backward: bool = False,
    lengths: bool = False,
    input_size: int = 0,
    cell: str = "rnn",
    proj_size: int = 0,
) -> dict:
    """How one layer of this size runs: which tier (``"none"`` when no tier of
    this build runs it), the workspace it needs, and its launch shape
    (grid, block, rows_per_cta, smem_bytes; 1, 1, rows of W_hh (of W_hh^T
    for ``backward``), 0 on the CPU). ``backward=True`` asks about the
    backward-data pass. With ``input_size``, the forward of a whole layer
    (``torch.ops.prnn.layer``; a gated one called without gradients,
    ``torch.ops.prnn.gated_layer``): ``fused_input_projection`` says whether
    its input projection runs inside the recurrence's launches (a few steps a
    launch a step, or on CTAs the recurrence leaves idle) rather than as a
    GEMM before it. ``cell`` is
    ``"rnn"``, ``"lstm"`` or ``"gru"`` (``nonlinearity`` is the Elman cell's
    only); ``proj_size`` is an LSTM's projection (0: none). ``module`` says
    what a module call of this shape runs: ``"prnn"``, or ``"torch"`` where
    torch's own recurrence is faster and the module hands the call to it
    (torch_prnn/_crossover.py; ``backward`` for a training call)."""
    tier, workspace_bytes, grid, block, rows_per_cta, smem_bytes, fused = torch.ops.prnn.plan(
        steps, batch, hidden_size, dtype, torch.device(device), nonlinearity, backward, lengths, input_size,
        cell, proj_size,
    )
    return {
        "tier": _TIERS[tier],
        "workspace_bytes": workspace_bytes,
        "grid": grid,
        "block": block,
        "rows_per_cta": rows_per_cta,
        "smem_bytes": smem_bytes,
        "fused_input_projection": bool(fused),
        "module": "torch" if _crossover.torch_runs(
            cell, dtype, torch.device(device).type, batch, hidden_size, proj_size, training=backward,
            device_index=torch.device(device).index, steps=steps, packed=lengths, input_size=input_size or None,
        ) else "prnn",
    }
