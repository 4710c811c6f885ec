"""PersistentLSTM: a drop-in replacement for torch.nn.LSTM on prnn::lstm."""

from typing import overload

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from ._recurrent import PersistentRNNBase

# The op overload itself: the packet's name lookup and dispatch cost host time per call.
_prnn_lstm = torch.ops.prnn.lstm.default
# TorchScript knows ops by name, not overload objects.
torch.jit._builtins._register_builtin(_prnn_lstm, "prnn::lstm")


class PersistentLSTM(PersistentRNNBase):
    """LSTM with the interface, parameters and numbers of
    :class:`torch.nn.LSTM` (projections included); each layer's input
    projection is one GEMM for all steps and its recurrence one persistent
    kernel (``torch.ops.prnn.lstm``) instead of one GEMM per step.

    Parameters have nn.LSTM's names, shapes, order and initialisation, so
    state dicts load both ways; :meth:`from_lstm` converts a module.
    ``forward`` takes batched, unbatched and packed input and returns
    ``(output, (h_n, c_n))`` as nn.LSTM does.
    """

    _input_dim_error = "LSTM: Expected input to be 2D or 3D, got {}D instead"

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(
            "LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout,
            bidirectional, proj_size, device, dtype,
        )
        self._state_sizes = (proj_size or hidden_size, hidden_size)  # h, c

    # nn.LSTM's versions of nn.RNNBase's helpers, with c's size (nn's own functions).
    get_expected_cell_size = nn.LSTM.get_expected_cell_size
    check_forward_args = nn.LSTM.check_forward_args
    permute_hidden = nn.LSTM.permute_hidden

    @classmethod
    def from_lstm(cls, lstm: nn.LSTM) -> "PersistentLSTM":
        """A PersistentLSTM with ``lstm``'s configuration, a copy of its
        weights (same device and dtype), and its training mode."""
        return cls._converted(lstm, nn.LSTM, "from_lstm", "proj_size")

    # TorchScript compiles forward once per input type, as it does nn.LSTM's.
    @overload
    @torch._jit_internal._overload_method
    def forward(
        self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        pass

    @overload
    @torch._jit_internal._overload_method
    def forward(  # noqa: F811
        self, input: PackedSequence, hx: tuple[Tensor, Tensor] | None = None
    ) -> tuple[PackedSequence, tuple[Tensor, Tensor]]:
        pass

    def forward(self, input, hx: tuple[Tensor, Tensor] | None = None):  # noqa: F811
        # Eager: the base's forward, which may hand the call to torch (_crossover.py).
        if not torch.jit.is_scripting():
            return PersistentRNNBase.forward(self, input, hx)
        states = None if hx is None else self._unpack_hx(hx)
        if isinstance(input, PackedSequence):
            return self._script_packed(input, states)
        return self._script_padded(input, states)

    def _unpack_hx(self, hx: tuple[Tensor, Tensor]) -> list[Tensor]:
        # One tensor would unpack along its first dimension (nn.LSTM raises on it too).
        if isinstance(hx, Tensor):
            raise TypeError("PersistentLSTM: hx must be a tuple (h_0, c_0) of two tensors, got a Tensor")
        if len(hx) < 2:  # an IndexError, as nn.LSTM's hx[1]
            raise IndexError(f"PersistentLSTM: hx must be a tuple (h_0, c_0) of two tensors, got {len(hx)}")
        if len(hx) > 2:
            raise RuntimeError("lstm expects two hidden states")
        return [hx[0], hx[1]]

    def _pack_hx(self, states: list[Tensor]) -> tuple[Tensor, Tensor]:
        return states[0], states[1]

    def _recurrence(
        self,
        xp: Tensor,
        states: list[Tensor],
        w_hh: Tensor,
        b_hh: Tensor | None,
        w_hr: Tensor | None,
        lengths: Tensor | None,
    ) -> tuple[Tensor, list[Tensor]]:
        y, h_n, c_n, _ = _prnn_lstm(xp, b_hh, states[0], states[1], w_hh, w_hr, lengths)
        return y, [h_n, c_n]
