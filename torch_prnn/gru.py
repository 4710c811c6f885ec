"""PersistentGRU: a drop-in replacement for torch.nn.GRU on prnn::gru."""

from typing import overload

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from ._recurrent import PersistentRNNBase, _refuse_proj_size

# The op overload itself: the packet's name lookup and dispatch cost host time per call.
_prnn_gru = torch.ops.prnn.gru.default
# TorchScript knows ops by name, not overload objects.
torch.jit._builtins._register_builtin(_prnn_gru, "prnn::gru")


class PersistentGRU(PersistentRNNBase):
    """GRU with the interface, parameters and numbers of
    :class:`torch.nn.GRU`; each layer's input projection is one GEMM for all
    steps and its recurrence one persistent kernel (``torch.ops.prnn.gru``)
    instead of one GEMM per step.

    Parameters have nn.GRU's names, shapes, order and initialisation, so
    state dicts load both ways; :meth:`from_gru` converts a module.
    ``forward`` takes batched, unbatched and packed input and returns
    ``(output, h_n)`` as nn.GRU does.
    """

    _input_dim_error = "GRU: Expected input to be 2D or 3D, got {}D instead"

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device=None,
        dtype=None,
        **kwargs,
    ) -> None:
        _refuse_proj_size("PersistentGRU", kwargs)
        super().__init__(
            "GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout,
            bidirectional, 0, device, dtype,
        )

    @classmethod
    def from_gru(cls, gru: nn.GRU) -> "PersistentGRU":
        """A PersistentGRU with ``gru``'s configuration, a copy of its
        weights (same device and dtype), and its training mode."""
        return cls._converted(gru, nn.GRU, "from_gru")

    # TorchScript compiles forward once per input type, as it does nn.GRU's.
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
            return PersistentRNNBase.forward(self, input, hx)
        states = None if hx is None else self._unpack_hx(hx)
        if isinstance(input, PackedSequence):
            return self._script_packed(input, states)
        return self._script_padded(input, states)

    def _recurrence(
        self,
        xp: Tensor,
        states: list[Tensor],
        w_hh: Tensor,
        b_hh: Tensor | None,
        w_hr: Tensor | None,
        lengths: Tensor | None,
    ) -> tuple[Tensor, list[Tensor]]:
        y, h_n, _ = _prnn_gru(xp, b_hh, states[0], w_hh, lengths)
        return y, [h_n]
