"""PersistentRNN: a drop-in replacement for torch.nn.RNN on the prnn:: ops."""

from typing import overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from . import _recurrent
from ._recurrent import _flip


# The op overloads themselves: the packet's name lookup and dispatch cost host time per call.
_prnn_layer, _prnn_forward = torch.ops.prnn.layer.default, torch.ops.prnn.forward.default
# TorchScript knows ops by name, not overload objects: these are prnn::layer and prnn::forward.
torch.jit._builtins._register_builtin(_prnn_layer, "prnn::layer")
torch.jit._builtins._register_builtin(_prnn_forward, "prnn::forward")


class PersistentRNN(_recurrent.PersistentRNNBase):
    """Elman RNN with the interface, parameters and numbers of
    :class:`torch.nn.RNN`; each layer's recurrence runs as one persistent
    kernel instead of one GEMM per step (``torch.ops.prnn.layer``, the input
    projection then the recurrence, for the forward direction; the input
    projection and ``torch.ops.prnn.forward`` for the reverse).

    Parameters have nn.RNN's names, shapes, order and initialisation, so state
    dicts load both ways; :meth:`from_rnn` converts a module. ``forward``
    takes batched, unbatched and packed input and returns ``(output, h_n)``
    as nn.RNN does.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device=None,
        dtype=None,
        **kwargs,
    ) -> None:
        # nn.RNN's checks, in its order and with its messages.
        _recurrent._refuse_proj_size("PersistentRNN", kwargs)
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(
                f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'."
            )
        mode = "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU"
        super().__init__(
            mode, input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, 0, device, dtype,
        )
        self.nonlinearity = nonlinearity

    def __setstate__(self, state) -> None:
        if "_flat_weights_names" not in state:  # pickled by a torch_prnn without these attributes
            names = [name for names in state["_all_weights"] for name in names]
            state = dict(state, mode="RNN_TANH" if state["nonlinearity"] == "tanh" else "RNN_RELU",
                         _flat_weights_names=names)
        if "_state_sizes" not in state:  # pickled by a torch_prnn whose PersistentRNN had a base of its own
            state = dict(state, _state_sizes=(state["hidden_size"],))
        super().__setstate__(state)

    @classmethod
    def from_rnn(cls, rnn: nn.RNN) -> "PersistentRNN":
        """A PersistentRNN with ``rnn``'s configuration, a copy of its
        weights (same device and dtype), and its training mode."""
        module = cls._converted(rnn, nn.RNN, "from_rnn", "nonlinearity")
        module.mode = rnn.mode  # what nn.RNN's forward computes by
        return module

    def _activation(self) -> str:
        """The activation forward computes: nn.RNN's forward reads it from
        mode (nonlinearity only sets mode at construction)."""
        if self.mode == "RNN_TANH":
            return "tanh"
        if self.mode == "RNN_RELU":
            return "relu"
        raise AssertionError(f"mode must be RNN_TANH or RNN_RELU, got {self.mode}")

    def _check_mode(self) -> None:
        self._activation()

    # TorchScript compiles forward once per input type, as it does nn.RNN's.
    @overload
    @torch._jit_internal._overload_method
    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        pass

    @overload
    @torch._jit_internal._overload_method
    def forward(  # noqa: F811
        self, input: PackedSequence, hx: Tensor | None = None
    ) -> tuple[PackedSequence, Tensor]:
        pass

    def forward(self, input, hx: Tensor | None = None):  # noqa: F811
        # Eager: the base's forward, which may hand the call to torch (_crossover.py).
        if not torch.jit.is_scripting():
            return _recurrent.PersistentRNNBase.forward(self, input, hx)
        states = None if hx is None else self._unpack_hx(hx)
        if isinstance(input, PackedSequence):
            return self._script_packed(input, states)
        return self._script_padded(input, states)

    def _layer(
        self,
        x: Tensor,
        states: list[Tensor],
        index: int,
        reverse: bool,
        lengths: Tensor | None,
        flip: Tensor | None,
    ) -> tuple[Tensor, list[Tensor]]:
        """One layer and direction: x [T,B,I] -> (y [T,B,H], [h_n [B,H]])."""
        weights = self._weights(index)
        w_ih, w_hh = weights[0], weights[1]
        b_ih, b_hh = (weights[2], weights[3]) if self.bias else (None, None)
        # h_n comes from the op: each sequence's state after its last step in
        # processing order (in reverse, after its first step in time).
        if reverse:
            # The projection of x itself, then reversed: its autograd keeps x,
            # which the forward direction keeps too, where prnn::layer on a
            # reversed x would keep a reversed copy of it.
            # b_ih + b_hh written as b_ih - (-1) b_hh: one op like the sum, but
            # its backward gives b_hh a gradient tensor of its own (the sum's
            # hands both biases one, which in-place use of either changes twice).
            bias: Tensor | None = None
            if b_ih is not None and b_hh is not None:
                bias = torch.sub(b_ih, b_hh, alpha=-1)
            xp = F.linear(x, w_ih, bias)
            y, h_n = _prnn_forward(_flip(xp, flip), states[0], w_hh, lengths, self._activation())
            return _flip(y, flip), [h_n]
        # All steps' input projections in one GEMM, then the recurrence: one op.
        y, h_n = _prnn_layer(x, w_ih, b_ih, b_hh, states[0], w_hh, lengths, self._activation())
        return y, [h_n]
