"""Python side of the prnn:: ops (defined in csrc/ops): fake kernels for
torch.compile / export, the backward ops' (refused) gradients, autocast, and
the plan query."""

import torch
from torch import Tensor

from . import _crossover

_TIERS = ("none", "cpu_reference", "persistent_registers", "persistent_shared", "stepwise", "persistent_cluster",
          "persistent_cluster_grid")


def _check_devices(op, x_name, x, others, lengths):
    """The real kernels' device checks, with their messages. The fake kernel is
    also the meta kernel, which the dispatcher picks whenever any argument is
    on the meta device: unchecked, a meta h0 beside a CPU xp would return an
    uninitialised CPU tensor."""
    for name, t in others:
        torch._check(
            t.device == x.device,
            lambda: f"{op}: {name} must be on the device of {x_name} ({x.device}), got {t.device}",
        )
    if lengths is not None:
        torch._check(
            lengths.device.type == "cpu",
            lambda: f"{op}: lengths must be a CPU tensor (like nn.RNN's batch_sizes), "
            f"got one on {lengths.device}",
        )


@torch.library.register_fake("prnn::forward")
def _forward_fake(xp, h0, w_hh, lengths, nonlinearity):
    _check_devices("prnn::forward", "xp", xp, (("h0", h0), ("w_hh", w_hh)), lengths)
    return _outputs(xp, xp.shape[0], xp.shape[1], xp.shape[2])


def _outputs(like, steps, batch, hidden):
    """y [steps, batch, hidden] and h_n [batch, hidden]: two contiguous
    tensors, as the real kernels return them."""
    return like.new_empty((steps, batch, hidden)), like.new_empty((batch, hidden))


@torch.library.register_fake("prnn::layer")
def _layer_fake(x, w_ih, b_ih, b_hh, h0, w_hh, lengths, nonlinearity):
    projection = [("w_ih", w_ih), ("b_ih", b_ih), ("b_hh", b_hh)]
    _check_devices("prnn::layer", "x", x, [(n, t) for n, t in projection if t is not None], None)
    # The recurrence's with prnn::forward's messages, as the real kernels raise them (xp is on x's device).
    _check_devices("prnn::forward", "xp", x, (("h0", h0), ("w_hh", w_hh)), lengths)
    # The shapes the real kernels check, so that tracing fails where running would.
    torch._check(x.dim() == 3, lambda: f"prnn::layer: x must be 3-D [steps, batch, input], got {x.dim()}-D")
    torch._check(
        w_ih.dim() == 2 and w_ih.shape[1] == x.shape[2],
        lambda: f"prnn::layer: w_ih must have shape [hidden, input={x.shape[2]}], got {list(w_ih.shape)}",
    )
    torch._check(
        (b_ih is None) == (b_hh is None),
        lambda: "prnn::layer: b_ih and b_hh must both be tensors or both be None",
    )
    steps, batch, hidden = x.shape[0], x.shape[1], w_ih.shape[0]
    for name, b in (("b_ih", b_ih), ("b_hh", b_hh)):
        torch._check(
            b is None or b.shape == (hidden,),
            lambda: f"prnn::layer: {name} must have shape [hidden={hidden}], got {list(b.shape)}",
        )
    torch._check(
        h0.shape == (batch, hidden) and w_hh.shape == (hidden, hidden),
        lambda: f"prnn::layer: h0 must be [batch={batch}, hidden={hidden}] and w_hh "
        f"[hidden, hidden], got {list(h0.shape)} and {list(w_hh.shape)}",
    )
    return _outputs(x, steps, batch, hidden)


@torch.library.register_fake("prnn::backward")
def _backward_fake(grad_y, y, h0, w_hh, lengths, nonlinearity, h0_grad=True):
    _check_devices(
        "prnn::backward", "y", y, (("h0", h0), ("w_hh", w_hh), ("grad_y", grad_y)), lengths
    )
    return y.new_empty(y.shape), h0.new_empty(h0.shape if h0_grad else (0,)), w_hh.new_empty(w_hh.shape)


@torch.library.register_fake("prnn::lstm")
def _lstm_fake(xp, b_hh, h0, c0, w_hh, w_hr, lengths, save=False):
    others = [("b_hh", b_hh), ("h0", h0), ("c0", c0), ("w_hh", w_hh), ("w_hr", w_hr)]
    _check_devices("prnn::lstm", "xp", xp, [(n, t) for n, t in others if t is not None], lengths)
    steps, batch, hidden = xp.shape[0], xp.shape[1], c0.shape[1]
    state = h0.shape[1]  # proj_size with w_hr, else hidden
    saved = xp.new_empty((steps, batch, 5 * hidden) if save else (0,))
    return xp.new_empty((steps, batch, state)), xp.new_empty((batch, state)), xp.new_empty((batch, hidden)), saved


@torch.library.register_fake("prnn::gru")
def _gru_fake(xp, b_hh, h0, w_hh, lengths, save=False):
    others = [("b_hh", b_hh), ("h0", h0), ("w_hh", w_hh)]
    _check_devices("prnn::gru", "xp", xp, [(n, t) for n, t in others if t is not None], lengths)
    steps, batch, hidden = xp.shape[0], xp.shape[1], h0.shape[1]
    saved = xp.new_empty((steps, batch, 4 * hidden) if save else (0,))
    return xp.new_empty((steps, batch, hidden)), xp.new_empty((batch, hidden)), saved


@torch.library.register_fake("prnn::lstm_backward")
def _lstm_backward_fake(grad_y, grad_h_n, grad_c_n, h0, c0, y, saved, w_hh, w_hr, lengths):
    others = [("grad_y", grad_y), ("grad_h_n", grad_h_n), ("grad_c_n", grad_c_n), ("h0", h0), ("c0", c0),
              ("saved", saved), ("w_hh", w_hh), ("w_hr", w_hr)]
    _check_devices("prnn::lstm_backward", "y", y, [(n, t) for n, t in others if t is not None], lengths)
    steps, batch, hidden = y.shape[0], y.shape[1], c0.shape[1]
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
    others = [("grad_y", grad_y), ("grad_h_n", grad_h_n), ("h0", h0), ("saved", saved), ("w_hh", w_hh)]
    _check_devices("prnn::gru_backward", "y", y, [(n, t) for n, t in others if t is not None], lengths)
    steps, batch, hidden = y.shape[0], y.shape[1], h0.shape[1]
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
        for _name in ("forward", "layer", "lstm", "gru"):
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
    backward-data pass. With ``input_size``, the forward of a whole Elman
    layer (``torch.ops.prnn.layer``): ``fused_input_projection`` says whether
    its input projection runs inside the recurrence's launch (on CTAs the
    recurrence leaves idle) rather than as a GEMM before it. ``cell`` is
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
            device_index=torch.device(device).index,
        ) else "prnn",
    }
