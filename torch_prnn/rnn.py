"""PersistentRNN: a drop-in replacement for torch.nn.RNN on the prnn:: ops."""

import math
from typing import overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from . import _crossover, _recurrent, _short
from ._recurrent import _flip, _time_indices


# The op overloads themselves: the packet's name lookup and dispatch cost host time per call.
_prnn_layer, _prnn_forward = torch.ops.prnn.layer.default, torch.ops.prnn.forward.default
# TorchScript knows ops by name, not overload objects: these are prnn::layer and prnn::forward.
torch.jit._builtins._register_builtin(_prnn_layer, "prnn::layer")
torch.jit._builtins._register_builtin(_prnn_forward, "prnn::forward")


class PersistentRNN(_recurrent.FlatWeights, _recurrent.NNHelpers, nn.Module):
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

    __jit_unused_properties__ = ["all_weights"]  # not compiled by TorchScript, as nn.RNN's

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
        super().__init__()
        # nn.RNN's checks, in its order and with its messages.
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        if kwargs:
            raise TypeError(
                f"PersistentRNN.__init__() got an unexpected keyword argument '{next(iter(kwargs))}'"
            )
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(
                f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'."
            )
        _recurrent.check_options(input_size, hidden_size, num_layers, bias, batch_first, dropout, stacklevel=3)

        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.nonlinearity = nonlinearity
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = 0  # nn.RNN has the attribute (always 0 for RNNs)
        self.mode = "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU"

        factory_kwargs = {"device": device, "dtype": dtype}
        num_directions = 2 if bidirectional else 1
        self._all_weights: list[list[str]] = []  # parameter names per (layer, direction)
        for layer in range(num_layers):
            for direction in range(num_directions):
                layer_input_size = input_size if layer == 0 else hidden_size * num_directions
                shapes = {
                    "weight_ih": (hidden_size, layer_input_size),
                    "weight_hh": (hidden_size, hidden_size),
                }
                if bias:
                    shapes.update(bias_ih=(hidden_size,), bias_hh=(hidden_size,))
                suffix = "_reverse" if direction == 1 else ""
                names = []
                for kind, shape in shapes.items():
                    name = f"{kind}_l{layer}{suffix}"
                    setattr(self, name, nn.Parameter(torch.empty(shape, **factory_kwargs)))
                    names.append(name)
                self._all_weights.append(names)
        self._flat_weights_names = [name for names in self._all_weights for name in names]
        self._init_flat_weights()  # and flatten_parameters, as nn's
        self.reset_parameters()

    def __setstate__(self, state) -> None:
        if "_flat_weights_names" not in state:  # pickled by a torch_prnn without these attributes
            names = [name for names in state["_all_weights"] for name in names]
            state = dict(state, mode="RNN_TANH" if state["nonlinearity"] == "tanh" else "RNN_RELU",
                         _flat_weights_names=names)
        super().__setstate__(state)

    def reset_parameters(self) -> None:
        # nn.RNN's init, parameter by parameter in the same order: the same seed
        # gives the same weights as nn.RNN.
        stdv = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.parameters():
            nn.init.uniform_(weight, -stdv, stdv)

    @classmethod
    def from_rnn(cls, rnn: nn.RNN) -> "PersistentRNN":
        """A PersistentRNN with ``rnn``'s configuration, a copy of its
        weights (same device and dtype), and its training mode."""
        if not isinstance(rnn, nn.RNN):
            raise TypeError(f"from_rnn expects a torch.nn.RNN, got {type(rnn).__name__}")
        weight = rnn.weight_ih_l0
        module = cls(
            rnn.input_size,
            rnn.hidden_size,
            rnn.num_layers,
            rnn.nonlinearity,
            rnn.bias,
            rnn.batch_first,
            rnn.dropout,
            rnn.bidirectional,
            device=weight.device,
            dtype=weight.dtype,
        )
        module.load_state_dict(rnn.state_dict())
        module.mode = rnn.mode  # what nn.RNN's forward computes by
        _recurrent.copy_requires_grad(rnn, module)
        return module.train(rnn.training)

    def _activation(self) -> str:
        """The activation forward computes: nn.RNN's forward reads it from
        mode (nonlinearity only sets mode at construction)."""
        if self.mode == "RNN_TANH":
            return "tanh"
        if self.mode == "RNN_RELU":
            return "relu"
        raise AssertionError(f"mode must be RNN_TANH or RNN_RELU, got {self.mode}")

    @torch.jit.unused
    def _torch_layers(self, x: Tensor, batch_sizes: Tensor | None, hx: Tensor) -> tuple[Tensor, Tensor]:
        """Every layer on torch's own recurrence, as nn.RNN calls it: x is
        [T, B, I] time-major, or the packed data with its batch_sizes."""
        return _crossover.run_torch(self, x, batch_sizes, hx, self._flat_weights)

    # As the gated modules' (torch_prnn/_recurrent.py): the same attributes, nn.RNNBase's.
    all_weights = _recurrent.PersistentRNNBase.all_weights
    flatten_parameters = _recurrent.PersistentRNNBase.flatten_parameters
    __prepare_scriptable__ = _recurrent.PersistentRNNBase.__prepare_scriptable__
    extra_repr = _recurrent.PersistentRNNBase.extra_repr

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
        if not torch.jit.is_scripting():
            # An eager call on tensor input: all layers in one op (torch_prnn/_short.py).
            if _short.applies(self, input):
                short = _short.forward(self, input, None if hx is None else [hx], (self.hidden_size,))
                if short is not None:
                    return short[0], short[1]
        num_directions = 2 if self.bidirectional else 1
        # isinstance and `packed_sizes is not None` (packed input only), not a
        # flag: TorchScript resolves these at compile time, for each input type.
        if isinstance(input, PackedSequence):
            data, batch_sizes, sorted_indices, unsorted_indices = input
            self._check_input(data, expected_dim=2)
            _recurrent.check_batch_sizes_type(batch_sizes)
            # Padded below where ours runs: nn.RNN's recurrence takes the packed data.
            packed_sizes = batch_sizes
            x = data
            steps, batch = batch_sizes.numel(), _recurrent.packed_batch(batch_sizes, data.shape[0], sorted_indices, hx)
            if hx is not None and sorted_indices is not None:
                # hx is in the caller's batch order; the padded batch is sorted.
                # Its shape first (nn.RNN permutes first): a batch too small
                # would index out of range (on CUDA a device-side assert, fatal to the
                # context), one too large would silently lose rows.
                expected_hidden = (self.num_layers * num_directions, batch, self.hidden_size)
                if hx.shape != expected_hidden:
                    raise RuntimeError(f"Expected hidden size {expected_hidden}, got {list(hx.shape)}")
                hx = hx.index_select(1, sorted_indices)
        else:
            if input.dim() not in (2, 3):
                raise ValueError(
                    f"RNN: Expected input to be 2D or 3D, got {input.dim()}D tensor instead"
                )
            is_batched = input.dim() == 3
            batch_dim = 0 if self.batch_first else 1
            if not is_batched:
                input = input.unsqueeze(batch_dim)
                if hx is not None:
                    if hx.dim() != 2:
                        raise RuntimeError(
                            "For unbatched 2-D input, hx should also be 2-D but got "
                            f"{hx.dim()}-D tensor"
                        )
                    hx = hx.unsqueeze(1)
            elif hx is not None and hx.dim() != 3:
                raise RuntimeError(
                    f"For batched 3-D input, hx should also be 3-D but got {hx.dim()}-D tensor"
                )
            self._check_input(input, expected_dim=3)
            x = input.transpose(0, 1) if self.batch_first else input  # steps x batch x features
            steps, batch = x.shape[0], x.shape[1]
            packed_sizes = None

        expected_hidden = (self.num_layers * num_directions, batch, self.hidden_size)
        if hx is None:
            hx = x.new_zeros(expected_hidden)
        elif hx.shape != expected_hidden:
            raise RuntimeError(f"Expected hidden size {expected_hidden}, got {list(hx.shape)}")
        if steps == 0:
            raise RuntimeError("Expected sequence length to be larger than 0 in RNN")

        self._activation()  # nn.RNN's check of mode, before either recurrence runs
        # Where torch's own recurrence is faster (large batches), nn.RNN's call runs.
        on_torch = False
        if not torch.jit.is_scripting():
            on_torch = _crossover.torch_runs(
                "rnn", x.dtype, x.device.type, batch, self.hidden_size,
                training=_crossover.needs_grad(self._forward_weights(), x, hx), steps=steps,
            )
        if on_torch:
            # packed: on the packed data, as nn.RNN runs it
            if packed_sizes is not None:
                _recurrent.check_packed_for_torch(packed_sizes, batch, x.shape[0])
            output, h_n = self._torch_layers(x, packed_sizes, hx)
        else:
            if not torch.jit.is_scripting():  # torch's recurrence (above) runs under them, as nn's
                _recurrent._refuse_func_autodiff("PersistentRNN")
            lengths: Tensor | None = None
            rows: Tensor | None = None
            if packed_sizes is not None:
                x, lengths, rows = _recurrent._pad(data, packed_sizes, batch)
            flip = _time_indices(lengths, num_directions, steps, x.device)
            states: list[Tensor] = []
            layer_input = x
            for layer in range(self.num_layers):
                if layer > 0 and self.dropout > 0 and self.training:
                    layer_input = _recurrent._layer_dropout(layer_input, self.dropout, rows)
                outputs: list[Tensor] = []
                for direction in range(num_directions):
                    index = layer * num_directions + direction
                    y, h = self._layer(layer_input, hx[index], index, direction == 1, lengths, flip)
                    outputs.append(y)
                    states.append(h)
                layer_input = torch.cat(outputs, -1) if num_directions == 2 else outputs[0]
            # One layer's h_n is already a tensor of its own: made 3-D in place, neither copied nor a
            # view (nn.RNN's h_n is none: detach_() works on it).
            output, h_n = layer_input, states[0].unsqueeze_(0) if len(states) == 1 else torch.stack(states)
            if rows is not None:
                output = output.flatten(0, 1).index_select(0, rows)

        if packed_sizes is not None:
            output = PackedSequence(
                output,
                packed_sizes,
                sorted_indices,
                unsorted_indices,
            )
            if unsorted_indices is not None:
                h_n = h_n.index_select(1, unsorted_indices)
            return output, h_n
        if self.batch_first:
            output = output.transpose(0, 1)
        if not is_batched:
            output, h_n = output.squeeze(batch_dim), h_n.squeeze(1)
        return output, h_n

    # The gated modules' check (dtype, rank, input_size), the same for every cell.
    _check_input = _recurrent.PersistentRNNBase._check_input

    def _weights(self, index: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """(w_ih, w_hh, b_ih, b_hh) of one layer and direction (biases None without bias)."""
        # _flat_weights, which nn.RNN's forward reads (forward brought it up to date).
        n = len(self._all_weights[index])  # the same for every layer and direction
        w = self._flat_weights[index * n : index * n + n]
        return (w[0], w[1], w[2], w[3]) if len(w) == 4 else (w[0], w[1], None, None)

    def _layer(
        self,
        x: Tensor,
        h0: Tensor,
        index: int,
        reverse: bool,
        lengths: Tensor | None,
        flip: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        """One layer and direction: x [T,B,I] -> (y [T,B,H], h_n [B,H])."""
        w_ih, w_hh, b_ih, b_hh = self._weights(index)
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
            y, h_n = _prnn_forward(_flip(xp, flip), h0, w_hh, lengths, self._activation())
        else:
            # All steps' input projections in one GEMM, then the recurrence: one op.
            y, h_n = _prnn_layer(x, w_ih, b_ih, b_hh, h0, w_hh, lengths, self._activation())
        return (_flip(y, flip) if reverse else y), h_n
