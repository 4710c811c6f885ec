"""PersistentRNNBase: what torch_prnn's recurrent modules share, as
torch.nn.RNNBase is for nn.RNN, nn.LSTM and nn.GRU: the constructor's checks,
the parameters and their initialisation, the nn attributes, and the input
handling of ``forward`` (packed, unbatched and batch-first input, hx checks,
layers, directions, dropout). A cell provides its ops in ``_recurrence``
(or a whole layer in ``_layer``) and, when it has more than one state, how
hx holds them."""

import math
import numbers
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from . import _crossover, _short

# Rows of W_ih and W_hh per hidden unit, by nn.RNNBase's mode.
_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}
# nn's module of a gated mode (nn.RNN's modes are RNN_TANH and RNN_RELU).
_NN_NAMES = {"LSTM": "LSTM", "GRU": "GRU"}


class FlatWeights:
    """nn.RNNBase's _flat_weights, kept as nn keeps it, for the modules to
    mix in before nn.Module: the weights in _flat_weights_names' order, the
    list forward reads, so that code assigning the list or an element of it
    changes what forward uses as it does with nn's modules. Kept in step on
    the assignment of a weight, after .to() and the like, in data-parallel
    replicas and pickles, and rebuilt at forward where an attribute no longer
    is the tensor it was taken from (torch.func.functional_call, a
    parametrization, weight_norm)."""

    def _init_flat_weights(self) -> None:
        """nn's: the list and its weak references from the attributes, then
        flatten_parameters."""
        self._flat_weights = [getattr(self, name) if hasattr(self, name) else None for name in self._flat_weights_names]
        self._flat_weight_refs = [None if w is None else weakref.ref(w) for w in self._flat_weights]
        self._flat_weights_stale = False
        self.flatten_parameters()

    def _update_flat_weights(self) -> list:
        """nn's _update_flat_weights (the list rebuilt where a weight
        attribute is no longer the tensor it was taken from), then the list.
        A weight in _parameters is read from there (getattr costs host time),
        and where the list holds it, it is taken from there unless assigned
        since (__setattr__ marks that); a computed one is read as nn reads it
        (hasattr, then getattr: a parametrization runs as often as nn's)."""
        if self._flat_weights_stale:
            self._init_flat_weights()
            return self._flat_weights
        params = self._parameters
        flat = self._flat_weights
        for name, listed, ref in zip(self._flat_weights_names, flat, self._flat_weight_refs):
            weight = params.get(name)
            if weight is None:
                weight = getattr(self, name) if hasattr(self, name) else None
            elif weight is listed:  # the list's own parameter, not assigned since
                continue
            if weight is not None and ref is not None and ref() is not weight:
                self._init_flat_weights()
                return self._flat_weights
        return flat

    def _forward_weights(self) -> list:
        """_update_flat_weights for a forward, which nn's runs on the list:
        an element that is not a tensor is a TypeError there too."""
        weights = self._update_flat_weights()
        for i, weight in enumerate(weights):
            if not isinstance(weight, Tensor):
                raise TypeError(
                    f"{type(self).__name__}: _flat_weights[{i}] ({self._flat_weights_names[i]}) must be a "
                    f"tensor, got {type(weight).__name__}"
                )
        return weights

    def __setattr__(self, name: str, value) -> None:
        names = self.__dict__.get("_flat_weights_names")
        if names is not None and name in names:
            index = names.index(name)
            self._flat_weights[index] = value
            # nn's next forward sees the attribute is not the tensor the list was built from, and rebuilds it.
            ref = self._flat_weight_refs[index] if index < len(self._flat_weight_refs) else None
            if value is not None and ref is not None and ref() is not value:
                self._flat_weights_stale = True
        super().__setattr__(name, value)

    def _apply(self, fn, recurse=True):
        # Conversions may put new tensors in _parameters directly, not through
        # __setattr__; no weak references during them (tensor swaps refuse
        # tensors that have some), and the list rebuilt even if one fails.
        self._flat_weight_refs = []
        try:
            return super()._apply(fn, recurse)
        finally:
            self._init_flat_weights()

    def _replicate_for_data_parallel(self):
        # A replica's weights are set on the replica: its own lists, not the original's.
        replica = super()._replicate_for_data_parallel()
        replica._flat_weights = replica._flat_weights[:]
        replica._flat_weights_names = replica._flat_weights_names[:]
        return replica

    def __getstate__(self):
        self._update_flat_weights()
        state = self.__dict__.copy()
        state.pop("_flat_weight_refs", None)  # weak references do not pickle
        return state

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        if "_flat_weights" not in state:  # pickled by a torch_prnn that computed the list
            self._flat_weights = [getattr(self, name, None) for name in self._flat_weights_names]
        self._flat_weight_refs = [None if w is None else weakref.ref(w) for w in self._flat_weights]
        self._flat_weights_stale = False


class NNHelpers:
    """nn.RNNBase's public helpers, nn's own functions, for the modules to
    mix in: code written against nn's modules (a subclass, a wrapper) calls
    them. They read only the attributes the modules share with nn's."""

    check_input = nn.RNNBase.check_input
    get_expected_hidden_size = nn.RNNBase.get_expected_hidden_size
    check_hidden_size = nn.RNNBase.check_hidden_size
    check_forward_args = nn.RNNBase.check_forward_args
    permute_hidden = nn.RNNBase.permute_hidden


class PersistentRNNBase(FlatWeights, NNHelpers, nn.Module):
    """Parameters, interface and input handling of torch.nn.RNNBase; the
    recurrence of each layer and direction is the subclass's ``_recurrence``:
    ``(xp [T,B,G*H], states [each B x size], w_hh, b_hh, w_hr, lengths) ->
    (y [T,B,S], [final states])``, annotated for TorchScript."""

    # nn's message for input that is neither 2-D nor 3-D: nn.RNN's words; LSTM
    # and GRU override it with nn.LSTM's and nn.GRU's (no "tensor").
    _input_dim_error = "RNN: Expected input to be 2D or 3D, got {}D tensor instead"
    __constants__ = ["_input_dim_error"]  # a class attribute: TorchScript sees it as a constant

    # Not compiled by TorchScript (it reads weights by name): the scripted
    # forward reads _flat_weights, which nn's scripted modules read too.
    __jit_unused_properties__ = ["all_weights"]

    def __init__(
        self,
        mode: str,
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
        super().__init__()
        # nn.RNNBase's checks, in its order and with its messages.
        check_options(input_size, hidden_size, num_layers, bias, batch_first, dropout, stacklevel=4)
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable projections")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")

        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        # The feature size of each state in hx: h only, unless a cell has more (LSTM's c).
        self._state_sizes = (proj_size or hidden_size,)

        factory_kwargs = {"device": device, "dtype": dtype}
        gate_size = _GATES[mode] * hidden_size
        output_size = proj_size or hidden_size
        num_directions = 2 if bidirectional else 1
        self._all_weights: list[list[str]] = []  # parameter names per (layer, direction)
        self._flat_weights_names: list[str] = []
        for layer in range(num_layers):
            for direction in range(num_directions):
                layer_input_size = input_size if layer == 0 else output_size * num_directions
                shapes = {
                    "weight_ih": (gate_size, layer_input_size),
                    "weight_hh": (gate_size, output_size),
                }
                if bias:
                    shapes.update(bias_ih=(gate_size,), bias_hh=(gate_size,))
                if proj_size:
                    shapes.update(weight_hr=(proj_size, hidden_size))
                suffix = "_reverse" if direction == 1 else ""
                names = []
                for kind, shape in shapes.items():
                    name = f"{kind}_l{layer}{suffix}"
                    setattr(self, name, nn.Parameter(torch.empty(shape, **factory_kwargs)))
                    names.append(name)
                self._all_weights.append(names)
                self._flat_weights_names.extend(names)
        self._init_flat_weights()  # and flatten_parameters, as nn's
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn's init, parameter by parameter in the same order: the same seed
        # gives the same weights as the nn module.
        stdv = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.parameters():
            nn.init.uniform_(weight, -stdv, stdv)

    @classmethod
    def _converted(cls, module: nn.Module, nn_class: type, method: str, *cell_options: str):
        """A module of `cls` with `module`'s configuration (with the cell's
        own options, such as proj_size, by name), a copy of its weights (same
        device and dtype), and its training mode."""
        if not isinstance(module, nn_class):
            raise TypeError(
                f"{method} expects a torch.nn.{nn_class.__name__}, got {type(module).__name__}"
            )
        weight = module.weight_ih_l0
        # The constructor's initialisation draws from a forked generator: converting leaves the
        # caller's random state (its next dropout mask, shuffle, init) as it was. Its options warned
        # at module's own construction: not again here.
        # (device_type named even with no device to fork: torch 2.11's fork_rng refuses None.)
        on_device = weight.device.type not in ("cpu", "meta")
        devices, device_type = ([weight.device], weight.device.type) if on_device else ([], "cpu")
        with torch.random.fork_rng(devices, device_type=device_type), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "dropout option adds dropout after all but last recurrent layer")
            converted = cls(
                module.input_size,
                module.hidden_size,
                num_layers=module.num_layers,
                bias=module.bias,
                batch_first=module.batch_first,
                dropout=module.dropout,
                bidirectional=module.bidirectional,
                device=weight.device,
                dtype=weight.dtype,
                **{option: getattr(module, option) for option in cell_options},
            )
        converted.load_state_dict(module.state_dict())
        copy_requires_grad(module, converted)
        return converted.train(module.training)

    @property
    def all_weights(self) -> list[list[nn.Parameter]]:
        return [[getattr(self, name) for name in names] for names in self._all_weights]

    def flatten_parameters(self) -> None:
        """As nn's: on CUDA, the parameters become views of one buffer in
        cuDNN's layout, which the calls handed to cuDNN (large batches,
        torch_prnn/_crossover.py) take as they are; the persistent kernels
        take each weight where it is. bfloat16 too, which nn's leaves as
        it is (_crossover.flatten_parameters)."""
        _crossover.flatten_parameters(self)

    def __prepare_scriptable__(self):
        # torch.jit.script calls this first. TorchScript has no _parameters
        # and no getattr by a computed name: the scripted forward reads the
        # weights from this list, which cannot follow a computed weight.
        computed = [name for name in self._flat_weights_names if name not in self._parameters]
        if computed:
            raise RuntimeError(
                f"torch.jit.script: {type(self).__name__} weights {computed} are computed (weight_norm "
                f"or another parametrization), which TorchScript does not support (nor for "
                f"nn.{_NN_NAMES.get(self.mode, 'RNN')}); torch.compile and torch.export do"
            )
        self._update_flat_weights()  # assigned elements kept, as nn's scripting keeps them
        return self

    def _torch_layers(self, x, batch_sizes, states, weights):
        """Every layer on torch's own recurrence, as nn.LSTM / nn.GRU call it:
        x is [T, B, I] time-major, or the packed data with its batch_sizes.
        Returns (output, the final states)."""
        hx = (states[0], states[1]) if self.mode == "LSTM" else states[0]
        result = _crossover.run_torch(self, x, batch_sizes, hx, weights)
        return result[0], list(result[1:])

    def extra_repr(self) -> str:
        s = "{input_size}, {hidden_size}"
        if self.proj_size != 0:
            s += ", proj_size={proj_size}"
        if self.num_layers != 1:
            s += ", num_layers={num_layers}"
        if self.bias is not True:
            s += ", bias={bias}"
        if self.batch_first is not False:
            s += ", batch_first={batch_first}"
        if self.dropout != 0:
            s += ", dropout={dropout}"
        if self.bidirectional is not False:
            s += ", bidirectional={bidirectional}"
        return s.format(**self.__dict__)

    # ---- hx as the caller passes it, and the states inside

    def _check_mode(self) -> None:
        """A cell's check that mode is one of its own (nn.RNN's forward has one)."""

    def _unpack_hx(self, hx: Tensor) -> list[Tensor]:
        """hx -> its states, each [layers * directions, batch, size]."""
        return [hx]

    def _pack_hx(self, states: list[Tensor]) -> Tensor:
        """The final states -> h_n as forward returns it."""
        return states[0]

    def forward(self, input, hx=None):
        # An eager call on tensor input: all layers in one op (torch_prnn/_short.py).
        if _short.applies(self, input):
            short = _short.forward(self, input, None if hx is None else self._unpack_hx(hx), self._state_sizes)
            if short is not None:
                return short[0], self._pack_hx(short[1:])
        states = None if hx is None else self._unpack_hx(hx)
        packed = isinstance(input, PackedSequence)
        if packed:
            data, batch_sizes, sorted_indices, unsorted_indices = input
            self._check_input(data, expected_dim=2)
            check_batch_sizes_type(batch_sizes)
            # Padded below only where ours runs: nn's recurrence takes the packed data.
            x = data
            steps = batch_sizes.numel()
            batch = packed_batch(batch_sizes, data.shape[0], sorted_indices, None if states is None else states[0])
        else:
            if input.dim() not in (2, 3):
                raise ValueError(self._input_dim_error.format(input.dim()))
            is_batched = input.dim() == 3
            if states is not None and any(state.dim() != input.dim() for state in states):
                raise RuntimeError(_state_dim_error(is_batched, states))
            batch_dim = 0 if self.batch_first else 1
            if not is_batched:
                input = input.unsqueeze(batch_dim)
                if states is not None:
                    states = [state.unsqueeze(1) for state in states]
            self._check_input(input, expected_dim=3)
            x = input.transpose(0, 1) if self.batch_first else input  # steps x batch x features
            steps, batch = x.shape[0], x.shape[1]

        num_directions = 2 if self.bidirectional else 1
        expected = [(self.num_layers * num_directions, batch, size) for size in self._state_sizes]
        if states is None:
            states = [x.new_zeros(shape) for shape in expected]
        else:
            # The shapes first: with a batch too small the permutation would
            # index out of range (on CUDA a device-side assert, fatal to the
            # context), with one too large it would silently drop rows.
            _check_state_sizes(states, expected)
            if packed and sorted_indices is not None:
                # hx is in the caller's batch order; the padded batch is sorted.
                states = [state.index_select(1, sorted_indices) for state in states]
        if steps == 0:
            raise RuntimeError("Expected sequence length to be larger than 0 in RNN")
        self._check_mode()  # before either recurrence runs

        # Where torch's own recurrence is faster (large batches), nn's call runs.
        weights = self._forward_weights()
        if _crossover.torch_runs(
            _crossover.CELL_OF_MODE[self.mode], x.dtype, x.device.type, batch, self.hidden_size, self.proj_size,
            training=_crossover.needs_grad(weights, x, *states), device_index=x.device.index, steps=steps,
            packed=packed, input_size=self.input_size, layers=self.num_layers, bidirectional=self.bidirectional,
        ):
            # packed: on the packed data, as nn runs it
            if packed:
                check_packed_for_torch(batch_sizes, batch, data.shape[0])
            output, states = self._torch_layers(data if packed else x, batch_sizes if packed else None, states, weights)
        else:
            _refuse_func_autodiff(type(self).__name__)  # torch's recurrence (above) runs under them, as nn's
            lengths = rows = None
            if packed:
                x, lengths, rows = _pad(data, batch_sizes, batch)
            flip = _time_indices(lengths, num_directions, steps, x.device)
            finals = []  # the final states of each layer and direction
            layer_input = x
            for layer in range(self.num_layers):
                if layer > 0 and self.dropout > 0 and self.training:
                    layer_input = _layer_dropout(layer_input, self.dropout, rows)
                outputs = []
                for direction in range(num_directions):
                    index = layer * num_directions + direction
                    layer_states = [state[index] for state in states]
                    y, final = self._layer(layer_input, layer_states, index, direction == 1, lengths, flip)
                    outputs.append(y)
                    finals.append(final)
                layer_input = torch.cat(outputs, -1) if num_directions == 2 else outputs[0]
            output = layer_input
            # One layer's final state is already a tensor of its own: made 3-D in place, neither copied
            # nor a view (nn's h_n is none: detach_() works on it).
            states = [state[0].unsqueeze_(0) if len(state) == 1 else torch.stack(state) for state in zip(*finals)]
            if packed:
                output = output.flatten(0, 1).index_select(0, rows)

        if packed:
            output = PackedSequence(
                output,
                batch_sizes,
                sorted_indices,
                unsorted_indices,
            )
            if unsorted_indices is not None:
                states = [state.index_select(1, unsorted_indices) for state in states]
        else:
            if self.batch_first:
                output = output.transpose(0, 1)
            if not is_batched:
                output = output.squeeze(batch_dim)
                states = [state.squeeze(1) for state in states]
        return output, self._pack_hx(states)

    # ---- forward under TorchScript: forward's steps in its order and with its
    # messages, on torch_prnn's ops only (the hand-over to torch is eager's).
    # Two methods, as TorchScript compiles forward once per input type; each
    # returns (output, h_n) as forward does. Eager forward keeps these steps
    # inline: as methods shared with it they cost it ~0.6 us of host time a call.

    def _script_padded(self, input: Tensor, states: list[Tensor] | None):
        if input.dim() not in (2, 3):
            raise ValueError(self._input_dim_error.format(input.dim()))
        is_batched = input.dim() == 3
        if states is not None and any(state.dim() != input.dim() for state in states):
            raise RuntimeError(_state_dim_error(is_batched, states))
        batch_dim = 0 if self.batch_first else 1
        if not is_batched:
            input = input.unsqueeze(batch_dim)
            if states is not None:
                states = [state.unsqueeze(1) for state in states]
        self._check_input(input, expected_dim=3)
        x = input.transpose(0, 1) if self.batch_first else input
        states = self._script_states(x, states, x.shape[0], x.shape[1], None)
        output, finals = self._script_layers(x, states, None, None)
        if self.batch_first:
            output = output.transpose(0, 1)
        if not is_batched:
            output = output.squeeze(batch_dim)
            finals = [state.squeeze(1) for state in finals]
        return output, self._pack_hx(finals)

    def _script_packed(self, input: PackedSequence, states: list[Tensor] | None):
        data, batch_sizes, sorted_indices, unsorted_indices = input
        self._check_input(data, expected_dim=2)
        check_batch_sizes_type(batch_sizes)
        batch = packed_batch(batch_sizes, data.shape[0], sorted_indices, None if states is None else states[0])
        states = self._script_states(data, states, batch_sizes.numel(), batch, sorted_indices)
        x, lengths, rows = _pad(data, batch_sizes, batch)  # batch_sizes' values checked here, as forward's order
        output, finals = self._script_layers(x, states, lengths, rows)
        output = output.flatten(0, 1).index_select(0, rows)
        if unsorted_indices is not None:
            finals = [state.index_select(1, unsorted_indices) for state in finals]
        return PackedSequence(output, batch_sizes, sorted_indices, unsorted_indices), self._pack_hx(finals)

    def _script_states(
        self, x: Tensor, states: list[Tensor] | None, steps: int, batch: int, sorted_indices: Tensor | None
    ) -> list[Tensor]:
        """hx's states (batched, in the caller's order), checked and sorted as
        forward does, or zeros like x; then forward's checks of the steps and
        the mode."""
        num_directions = 2 if self.bidirectional else 1
        expected = [(self.num_layers * num_directions, batch, size) for size in self._state_sizes]
        if states is None:
            states = [x.new_zeros(shape) for shape in expected]
        else:
            _check_state_sizes(states, expected)  # before the permutation, as forward
            if sorted_indices is not None:
                states = [state.index_select(1, sorted_indices) for state in states]
        if steps == 0:
            raise RuntimeError("Expected sequence length to be larger than 0 in RNN")
        self._check_mode()
        return states

    def _script_layers(
        self, x: Tensor, states: list[Tensor], lengths: Tensor | None, rows: Tensor | None
    ) -> tuple[Tensor, list[Tensor]]:
        """x [T,B,I] time-major and the states as _script_states gives them
        -> (output [T,B,D*S], the final states); packed input's lengths and
        rows as _pad gives them."""
        num_directions = 2 if self.bidirectional else 1
        flip = _time_indices(lengths, num_directions, x.shape[0], x.device)
        finals: list[list[Tensor]] = []  # the final states of each layer and direction
        layer_input = x
        for layer in range(self.num_layers):
            if layer > 0 and self.dropout > 0 and self.training:
                layer_input = _layer_dropout(layer_input, self.dropout, rows)
            outputs: list[Tensor] = []
            for direction in range(num_directions):
                index = layer * num_directions + direction
                layer_states = [state[index] for state in states]
                y, final = self._layer(layer_input, layer_states, index, direction == 1, lengths, flip)
                outputs.append(y)
                finals.append(final)
            layer_input = torch.cat(outputs, -1) if num_directions == 2 else outputs[0]
        return layer_input, [torch.stack([final[i] for final in finals]) for i in range(len(states))]

    def _check_input(self, input: Tensor, expected_dim: int) -> None:
        # Under TorchScript the ops check the dtypes, as nn's do there.
        if not torch.jit.is_scripting():
            weight = self._flat_weights[0]  # nn's check reads the list (a parametrization runs no extra time)
            if input.dtype != weight.dtype and not torch._C._is_any_autocast_enabled():  # nn's test
                raise ValueError(
                    f"RNN input dtype ({input.dtype}) does not match weight dtype ({weight.dtype}). "
                    f"Convert input: input.to({weight.dtype}), or convert model: "
                    f"model.to({input.dtype})"
                )
        if input.dim() != expected_dim:
            raise RuntimeError(f"input must have {expected_dim} dimensions, got {input.dim()}")
        if self.input_size != input.size(-1):
            raise RuntimeError(
                "input.size(-1) must be equal to input_size. Expected "
                f"{self.input_size}, got {input.size(-1)}"
            )

    def _weights(self, index: int) -> list[Tensor]:
        """The parameters of one layer and direction, in nn's order:
        w_ih, w_hh, then b_ih, b_hh with bias, then w_hr with proj_size."""
        n = len(self._all_weights[index])  # the same for every layer and direction
        return self._flat_weights[index * n : index * n + n]

    def _layer(
        self,
        x: Tensor,
        states: list[Tensor],
        index: int,
        reverse: bool,
        lengths: Tensor | None,
        flip: Tensor | None,
    ) -> tuple[Tensor, list[Tensor]]:
        """One layer and direction: x [T,B,I] -> (y [T,B,S], its final states)."""
        weights = self._weights(index)
        w_ih, w_hh = weights[0], weights[1]
        b_ih, b_hh = (weights[2], weights[3]) if self.bias else (None, None)
        w_hr = weights[-1] if self.proj_size else None
        # All steps' input projections in one GEMM; b_hh goes to the cell (GRU's
        # b_hn is inside r * (...)). For the reverse direction the projection
        # of x itself, then reversed: its autograd keeps x, which the forward
        # direction keeps too, where projecting a reversed x would keep a copy.
        xp = F.linear(x, w_ih, b_ih)
        if reverse:
            xp = _flip(xp, flip)
        y, final = self._recurrence(xp, states, w_hh, b_hh, w_hr, lengths)
        return (_flip(y, flip) if reverse else y), final

    def _recurrence(self, xp, states, w_hh, b_hh, w_hr, lengths):
        raise NotImplementedError


def check_options(input_size, hidden_size, num_layers, bias, batch_first, dropout, stacklevel: int) -> None:
    """nn.RNNBase's constructor checks of the options every cell has, in its
    order and with its messages; stacklevel: the dropout warning's, pointing
    at the caller of the module's constructor."""
    if (
        not isinstance(dropout, numbers.Number)
        or not 0 <= dropout <= 1
        or isinstance(dropout, bool)
    ):
        raise ValueError(
            "dropout should be a number in range [0, 1] representing the "
            "probability of an element being zeroed"
        )
    if dropout > 0 and num_layers == 1:
        warnings.warn(
            "dropout option adds dropout after all but last recurrent layer, so "
            "non-zero dropout expects num_layers greater than 1, but got "
            f"dropout={dropout} and num_layers={num_layers}",
            stacklevel=stacklevel,
        )
    if not isinstance(bias, bool):
        raise TypeError(f"bias should be of type bool, got: {type(bias).__name__}")
    if not isinstance(batch_first, bool):
        raise TypeError(
            f"batch_first should be of type bool, got: {type(batch_first).__name__}"
        )
    if not isinstance(input_size, int):
        raise TypeError(f"input_size should be of type int, got: {type(input_size).__name__}")
    if input_size <= 0:
        raise ValueError("input_size must be greater than zero")
    if not isinstance(hidden_size, int):
        raise TypeError(
            f"hidden_size should be of type int, got: {type(hidden_size).__name__}"
        )
    if hidden_size <= 0:
        raise ValueError("hidden_size must be greater than zero")
    if num_layers <= 0:
        raise ValueError("num_layers must be greater than zero")


def _refuse_proj_size(cls_name: str, kwargs: dict) -> None:
    """nn.RNN's and nn.GRU's answer to a proj_size argument, and Python's to
    any other unexpected keyword (the cells take **kwargs to see it)."""
    if "proj_size" in kwargs:
        raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
    if kwargs:
        raise TypeError(f"{cls_name}.__init__() got an unexpected keyword argument '{next(iter(kwargs))}'")


def _state_dim_error(batched: bool, states: list[Tensor]) -> str:
    """nn's message for states of the wrong rank: hx alone, or LSTM's hx and cx."""
    kind, rank = ("batched 3-D", 3) if batched else ("unbatched 2-D", 2)
    if len(states) == 1:
        return f"For {kind} input, hx should also be {rank}-D but got {states[0].dim()}-D tensor"
    ranks = ", ".join(f"{state.dim()}-D" for state in states)
    return f"For {kind} input, hx and cx should also be {rank}-D but got ({ranks}) tensors"


def _check_state_sizes(states: list[Tensor], expected: list[tuple[int, int, int]]) -> None:
    """nn's check of each state's shape: "hidden" alone, or LSTM's hidden[0] and hidden[1]."""
    for i, (state, shape) in enumerate(zip(states, expected)):
        if state.shape != shape:
            what = "hidden" if len(states) == 1 else f"hidden[{i}]"
            raise RuntimeError(f"Expected {what} size {shape}, got {list(state.shape)}")


def _refuse_func_autodiff(module_name: str) -> None:
    """torch.func's autodiff transforms (grad, vjp, jacrev, hessian, jvp,
    jacfwd) do not see through the autograd of the prnn:: ops (C++
    torch::autograd::Functions): they fail inside torch or at the ops'
    forward-mode check. Refuse them with one clear error before the ops run;
    vmap and torch.autograd work."""
    if torch.compiler.is_compiling():
        return
    stack = torch._C._functorch.get_interpreter_stack()
    autodiff = (torch._C._functorch.TransformType.Grad, torch._C._functorch.TransformType.Jvp)
    if stack and any(interpreter.key() in autodiff for interpreter in stack):
        raise RuntimeError(
            f"{module_name} does not support torch.func's autodiff transforms (grad, vjp, "
            "jacrev, hessian, jvp, jacfwd); use torch.autograd (loss.backward(), "
            "torch.autograd.grad) instead. torch.vmap is supported."
        )


def copy_requires_grad(source: nn.Module, copy: nn.Module) -> None:
    """Each parameter of `copy` requires grad as `source`'s of its name does
    (load_state_dict copies values only): a frozen weight stays frozen."""
    flags = {name: p.requires_grad for name, p in source.named_parameters()}
    for name, p in copy.named_parameters():
        if name in flags:
            p.requires_grad_(flags[name])


def check_batch_sizes_type(batch_sizes: Tensor) -> None:
    """A PackedSequence's batch_sizes as pack_padded_sequence makes them: a
    1-D tensor of integers (TypeError, as nn's modules raise, otherwise)."""
    if batch_sizes.dim() != 1:
        raise TypeError(f"PackedSequence: batch_sizes must be a 1-D tensor of integers, got {batch_sizes.dim()}-D")
    if batch_sizes.is_floating_point() or batch_sizes.is_complex() or batch_sizes.dtype == torch.bool:
        raise TypeError("PackedSequence: batch_sizes must be a 1-D tensor of integers, got other values")


def check_batch_sizes(batch_sizes: Tensor, rows: int) -> None:
    """prnn::packed_rows' check of batch_sizes' values (non-negative,
    non-increasing, summing to the number of packed rows) in Python, for
    TorchScript: there an op's error reaches the caller as another type than
    eager's, a Python one as eager's."""
    if (bool((batch_sizes < 0).any()) or bool((batch_sizes[1:] > batch_sizes[:-1]).any())
            or int(batch_sizes.sum()) != rows):
        sizes = torch.jit.annotate(list[int], batch_sizes.tolist())  # TorchScript needs its type
        raise RuntimeError(
            "PackedSequence: batch_sizes must be non-negative, non-increasing and sum to the number of "
            f"data rows, got batch_sizes {sizes} for {rows} rows"
        )


def check_packed_for_torch(batch_sizes: Tensor, batch: int, rows: int) -> None:
    """batch_sizes checked as our path checks them (prnn::packed_rows)
    before a packed call goes to torch's recurrence, which reads them
    unchecked (a malformed one gives a wrong answer there, or reads out of
    range), so that the error does not depend on which code runs the call.
    Not in a compiled graph, where batch_sizes are data and the check is
    nn's."""
    if torch.jit.is_scripting():
        check_batch_sizes(batch_sizes, rows)
    elif not torch.compiler.is_compiling():
        torch.ops.prnn.check_packed(batch_sizes, batch, rows)


def packed_batch(batch_sizes: Tensor, rows: int, sorted_indices: Tensor | None, hx: Tensor | None) -> int:
    """The number of sequences of a PackedSequence of `rows` packed rows:
    batch_sizes[0] (IndexError for an empty one, as nn's modules raise; a
    negative one gets the batch_sizes error here, before any state is made
    from it). Under torch.compile batch_sizes is data to the graph and a size
    read from it is unbacked, which shapes cannot be compared with; there the
    batch is sorted_indices' or hx's where one is given, and
    prnn::packed_rows checks batch_sizes against it when the graph runs."""
    if torch.compiler.is_compiling():
        if sorted_indices is not None:
            return sorted_indices.shape[0]
        if hx is not None and hx.dim() == 3:
            return hx.shape[1]
        return int(batch_sizes[0])
    batch = int(batch_sizes[0])
    if batch < 0:
        check_batch_sizes(batch_sizes, rows)
    if sorted_indices is not None and sorted_indices.shape[0] != batch:  # nn would give a state of the wrong batch
        raise RuntimeError(
            f"PackedSequence: batch_sizes[0] is a batch of {batch} sequences, but sorted_indices has "
            f"{sorted_indices.shape[0]} entries"
        )
    return batch


def _pad(data: Tensor, batch_sizes: Tensor, batch: int) -> tuple[Tensor, Tensor, Tensor]:
    """Packed rows [N, I] of `batch` sequences -> (padded [T, B, I] with zeros
    past each length, lengths [B] on the CPU, index of each packed row in the
    flattened padded [T*B] rows, on data's device). prnn::packed_rows checks
    batch_sizes (a graph's too, before anything uses its indices: out of
    range on a GPU, a device-side assert ends the process's CUDA context) and
    writes an eager GPU call's index straight into pinned memory."""
    steps, rows = batch_sizes.numel(), data.shape[0]
    if torch.jit.is_scripting():
        check_batch_sizes(batch_sizes, rows)
    pinned = data.is_cuda and not torch.compiler.is_compiling()
    lengths, index = torch.ops.prnn.packed_rows(batch_sizes, batch, rows, pinned)
    index = to_device_queued(index, data.device, pinned)
    padded = data.new_zeros(steps * batch, data.shape[-1]).index_copy(0, index, data)
    return padded.view(steps, batch, data.shape[-1]), lengths, index


def _time_indices(lengths: Tensor | None, num_directions: int, steps: int, device: torch.device) -> Tensor | None:
    """For packed input to a bidirectional module: the step index [T,B,1]
    that reverses each sequence within its length (padding stays in place),
    for the reverse direction. None without lengths or a reverse direction."""
    if lengths is None or num_directions != 2:
        return None
    t = torch.arange(steps).unsqueeze(1)
    flip = torch.where(t < lengths, lengths - 1 - t, t)
    return to_device_queued(flip.unsqueeze(-1), device)


def to_device_queued(host: Tensor, device: torch.device, pinned: bool = False) -> Tensor:
    """A CPU tensor (in pinned memory already where `pinned`) copied to
    `device` without waiting for the GPU: a blocking copy from pageable memory
    synchronises the stream (the host would wait for every kernel queued
    before it, each packed call), one from pinned memory is queued on the
    stream. Not under CUDA graph capture: a replay would copy again from a
    host buffer reused by then. Traced by torch.compile: the plain copy."""
    if device.type == "cuda" and not torch.compiler.is_compiling():
        if not torch.jit.is_scripting():  # scripted: the op's own lengths copy refuses it
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    "packed input cannot be captured in a CUDA graph: its lengths are host data, which a "
                    "replay would not read again; capture padded input"
                )
        return (host if pinned else host.pin_memory()).to(device, non_blocking=True)
    return host.to(device)


def _layer_dropout(x: Tensor, p: float, rows: Tensor | None) -> Tensor:
    """Dropout of a layer's input [T, B, F] as nn applies it: on packed input
    (rows: where the packed rows sit in the flattened padded batch) to the
    packed rows alone, in their order, so that a seed draws nn's mask and
    leaves the generator where nn's call leaves it; else to the whole tensor."""
    if rows is None:
        return F.dropout(x, p, training=True)
    flat = x.flatten(0, 1)
    dropped = F.dropout(flat.index_select(0, rows), p, training=True)
    return flat.index_copy(0, rows, dropped).view(x.shape)


def _flip(x: Tensor, flip: Tensor | None) -> Tensor:
    """Reverses time, within each sequence's length when there are lengths."""
    if flip is None:
        return x.flip(0)
    return x.gather(0, flip.expand(-1, -1, x.shape[2]))
