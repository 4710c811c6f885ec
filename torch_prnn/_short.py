"""The short path of the modules' forward, for the eager call on tensor input
of a one-direction module: an inference server's or a robot's one timestep a
call, and the calls handed to torch's recurrence (torch_prnn/_crossover.py:
large batches, the CPU's LSTMs). It checks only what decides that the call is
such a one and valid, then runs every layer in one op, ``torch.ops.prnn.layers``,
which runs the ops of the regular path in its order with its arguments
(autograd, autocast and dispatch modes see the same ops; but a gated layer
on CUDA that needs no gradient runs as prnn::gated_layer, one launch at
T = 1), or hands the call
over with nn's own torch._VF call, on the input as nn passes it, so that a
handed-over call costs what nn's does. Everything else takes the regular path,
which raises its own error for bad input: packed input, two directions, a
dtype or shape the regular path would refuse (or autocast), and calls under torch.compile,
torch.export, TorchScript, tracing, torch.func's transforms, a
__torch_function__ mode or with a tensor subclass that overrides it."""

import torch
from torch import Tensor

from . import _crossover

_layers = torch.ops.prnn.layers.default
_interpreters = torch._C._functorch.get_interpreter_stack
_is_tracing = torch._C._is_tracing
_has_torch_function = torch._C._has_torch_function
_has_torch_function_unary = torch._C._has_torch_function_unary


def applies(module, input) -> bool:
    """Whether forward may try the short path: an eager call on a plain
    tensor, one direction."""
    return (
        isinstance(input, Tensor)
        and not module.bidirectional
        and not _has_torch_function_unary(input)
        and not torch.compiler.is_compiling()
        and not _is_tracing()
        and not _interpreters()
    )


def forward(module, input: Tensor, states: list | None, sizes: tuple[int, ...]):
    """(output, h_n, c_n) of the module's forward (c_n None but for an LSTM),
    on our op or handed over to torch's recurrence as the regular path would,
    or None where the regular path must run. states: hx's (h, and an LSTM's
    c), or None for zeros; sizes: their feature sizes."""
    dim = input.dim()
    if dim != 3 and dim != 2:
        return None
    if states is not None:
        for state in states:
            if not isinstance(state, Tensor) or state.dim() != dim:
                return None
    h, c = (None, None) if states is None else (states[0], states[1] if len(states) == 2 else None)
    weights = module._update_flat_weights()  # nn's forward reads this list too
    for weight in weights:
        if weight is None:
            return None
    if _has_torch_function(weights) or _has_torch_function((h, c)):
        return None
    # A mode the weights are not of (set after construction): the regular path raises nn's error.
    gates = _crossover.GATES_OF_CELL.get(_crossover.CELL_OF_MODE.get(module.mode))
    if gates is None or weights[1].dim() != 2 or weights[1].shape[0] != gates * module.hidden_size:
        return None
    if input.dtype != weights[0].dtype or input.shape[-1] != module.input_size:
        return None

    # A batch dimension as the regular path adds it.
    batched = dim == 3
    batch_first = module.batch_first
    x = input
    if not batched:
        x = x.unsqueeze(0 if batch_first else 1)
        if h is not None:
            h = h.unsqueeze(1)
            c = None if c is None else c.unsqueeze(1)
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    layers = module.num_layers
    if h is not None and (h.shape != (layers, batch, sizes[0])
                          or c is not None and c.shape != (layers, batch, sizes[1])):
        return None
    if steps == 0:
        return None
    training = _crossover.needs_grad(weights, x, h, c)
    on_torch = _crossover.torch_runs(_crossover.CELL_OF_MODE[module.mode], x.dtype, x.device.type, batch,
                                          module.hidden_size, module.proj_size, training=training,
                                          device_index=x.device.index, steps=steps, layers_op=True,
                                          input_size=module.input_size, layers=layers,
                                          bidirectional=module.bidirectional)
    if not on_torch and batch_first:  # time first for our op, before the zeros as in the regular path
        x = x.transpose(0, 1)
    if h is None:
        h = x.new_zeros((layers, batch, sizes[0]))
        c = None if len(sizes) == 1 else x.new_zeros((layers, batch, sizes[1]))
    if on_torch:
        # nn's own call, on the input as nn passes it (batch-first or not).
        result = _crossover.run_torch(module, x, None, h if c is None else (h, c), weights, batch_first)
        output, h_n, c_n = result[0], result[1], (result[2] if c is not None else None)
    else:
        dropout = module.dropout if module.training else 0.0
        output, h_n, c_n = _layers(x, h, c, weights, module.mode, dropout)
        if batch_first:
            output = output.transpose(0, 1)
    if not batched:
        output = output.squeeze(0 if batch_first else 1)
        h_n = h_n.squeeze(1)
        c_n = None if c_n is None else c_n.squeeze(1)
    return output, h_n, c_n
