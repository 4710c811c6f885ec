"""Where torch's own recurrence is faster than the persistent kernels, and the
modules hand the call to it (``torch._VF``'s rnn_tanh / rnn_relu / lstm / gru,
what nn.RNN, nn.LSTM and nn.GRU run: cuDNN on CUDA, oneDNN or ATen on the
CPU), so that a module is never slower than the one it replaces.

The persistent kernels run a large batch in waves of the sequences that fit
on chip, while cuDNN's per-step GEMMs grow sub-linearly in the batch; on the
CPU nn.LSTM runs oneDNN's fused LSTM. The limits below are the largest
batches at which ours was at least as fast as the torch module in the same
run, eager, T in {16, 64, 256} (NVIDIA H200, torch 2.11, cuDNN 9.19:
bench/results/sweep_NVIDIA_H200.json and NVIDIA_H200.json; the CPU:
bench/results/cpu.json; bench/NOTES.md steps 43 and 45 have the figures). Other GPUs
were not measured: the same limits apply there.

``PRNN_TORCH_FALLBACK=0`` in the environment turns the hand-over off (every
call on the persistent kernels), for measuring them.
"""

import os

import torch

_INF = float("inf")

# (largest hidden size, largest batch on the persistent kernels) rows, in
# increasing hidden size; the first row whose hidden size is at least H
# decides; past the last row (the gated cells' stepwise tier) torch runs.
_CUDA_LIMITS = {
    # Elman, float32: the cluster tier holds H <= 768 up to B = 128 (1.35-2.0x
    # at B = 128 H = 512); elsewhere ours fell below nn.RNN at B * H ~ 64K.
    ("rnn", "float32", False): ((384, 32), (768, 128), (1536, 32), (_INF, 16)),
    ("rnn", "float32", True): ((384, 32), (768, 128), (1536, 32), (_INF, 16)),
    # Elman, 16-bit: tensor-core kernels, ahead at every batch measured up to
    # H = 1024 (B = 256: 1.8x); H = 2048 B = 32 even (0.98-1.04), B = 64 0.4-0.6x.
    ("rnn", "16-bit", False): ((1536, _INF), (_INF, 16)),
    ("rnn", "16-bit", True): ((1536, _INF), (_INF, 16)),
    # LSTM: ours below nn.LSTM from B * H = 32K on the persistent family (B = 64
    # H = 512: 0.84-0.94x, B = 32 H = 1024: 0.43-0.67x); float32 training at
    # H = 1024 already at B = 16 (0.77x). In 16 bits at H <= 512 the forward runs
    # on the cluster family, which holds 8 sequences a cluster on 7 clusters at
    # H > 256 (1.5-2.2 us a step at B = 32, 8-10x nn.LSTM) and took B = 64 at
    # H = 256 (2.0 us, 11x); its backward stays on the persistent family.
    ("lstm", "float32", False): ((384, 64), (768, 32), (1024, 16)),
    ("lstm", "float32", True): ((384, 64), (768, 32), (1024, 8)),
    ("lstm", "bfloat16", False): ((256, 64), (512, 56), (768, 32), (1024, 16)),
    ("lstm", "bfloat16", True): ((384, 64), (768, 32), (1024, 16)),
    # float16 LSTM from B = 8: cuDNN's persistent kernel, whose forward+backward
    # beat ours at every H (B = 8 H = 256: 5.4 against 6.3 us a step); its
    # forward (B = 8 H = 256: 1.9 us eager) loses to the cluster family's.
    ("lstm", "float16", False): ((512, 56), (1024, 4)),
    ("lstm", "float16", True): ((1024, 4),),
    # GRU: as the LSTM (B = 64 H = 512: 0.75-0.99x; B = 32 H = 1024: 0.61-0.81x),
    # the 16-bit forward on the cluster family too (B = 64 H = 256: 1.5 us, 9x).
    ("gru", "float32", False): ((384, 64), (768, 32), (1024, 16)),
    ("gru", "float32", True): ((384, 64), (768, 32), (1024, 16)),
    ("gru", "16-bit", False): ((256, 64), (512, 56), (768, 32), (1024, 16)),
    ("gru", "16-bit", True): ((384, 64), (768, 32), (1024, 16)),
}

# On the CPU, nn.LSTM's oneDNN LSTM beat our ATen steps at H = 256 and 1024
# (0.2-0.7x, T = 256, B 1-16); at H = 8 one step a call ours was faster (19
# against 45 µs: bench/NOTES.md, one timestep a call). Elman and GRU were at
# least even (0.98-1.25x forward).
_CPU_TORCH_CELLS = ("lstm",)
_CPU_TORCH_MIN_HIDDEN = 256

enabled = os.environ.get("PRNN_TORCH_FALLBACK", "1") != "0"

# The cell of each nn.RNNBase mode, as torch_is_faster names it.
CELL_OF_MODE = {"RNN_TANH": "rnn", "RNN_RELU": "rnn", "LSTM": "lstm", "GRU": "gru"}


def _dtype_class(cell: str, dtype: torch.dtype) -> str:
    if cell != "lstm":
        return "float32" if dtype == torch.float32 else "16-bit"
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]


def torch_is_faster(cell: str, dtype: torch.dtype, device_type: str, batch: int, hidden: int,
                    proj_size: int = 0, training: bool = False) -> bool:
    """Whether a module call of this cell ("rnn", "lstm", "gru"), dtype,
    device, batch and hidden size runs faster on torch's own recurrence;
    training: the call's backward runs too. float64 always stays on ours
    (the reference the tests use), as does every device but CUDA and the CPU."""
    if not enabled or dtype == torch.float64:
        return False
    if device_type == "cpu":
        return cell in _CPU_TORCH_CELLS and hidden >= _CPU_TORCH_MIN_HIDDEN
    if device_type != "cuda" or dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    if proj_size > 0:  # our stepwise tier
        return True
    for max_hidden, max_batch in _CUDA_LIMITS[(cell, _dtype_class(cell, dtype), training)]:
        if hidden <= max_hidden:
            return batch > max_batch
    return True


def needs_grad(weights, *tensors) -> bool:
    """Whether a call's backward can run: grad mode on and any of its tensors requiring grad."""
    if not torch.is_grad_enabled():
        return False
    return any(t.requires_grad for t in weights) or any(t.requires_grad for t in tensors)
