"""PersistentLSTM: a drop-in replacement for torch.nn.LSTM on prnn::lstm."""

import torch
from torch import nn

from ._recurrent import PersistentRNNBase

# The op overload itself: the packet's name lookup and dispatch cost host time per call.
_prnn_lstm = torch.ops.prnn.lstm.default


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

    @classmethod
    def from_lstm(cls, lstm: nn.LSTM) -> "PersistentLSTM":
        """A PersistentLSTM with ``lstm``'s configuration, a copy of its
        weights (same device and dtype), and its training mode."""
        return cls._converted(lstm, nn.LSTM, "from_lstm", "proj_size")

    def _unpack_hx(self, hx):
        if len(hx) != 2:
            raise RuntimeError("lstm expects two hidden states")
        return [hx[0], hx[1]]

    def _pack_hx(self, states):
        return states[0], states[1]

    def _recurrence(self, xp, states, w_hh, b_hh, w_hr, lengths):
        y, h_n, c_n, _ = _prnn_lstm(xp, b_hh, states[0], states[1], w_hh, w_hr, lengths)
        return y, h_n, c_n
