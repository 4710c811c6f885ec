"""Where torch's own recurrence is faster than the persistent kernels, and the
modules hand the call to it (``torch._VF``'s rnn_tanh / rnn_relu / lstm / gru,
what nn.RNN, nn.LSTM and nn.GRU run: cuDNN on CUDA, oneDNN or ATen on the
CPU), so that a module is not slower than the one it replaces where measured.

The persistent kernels run a large batch in waves of the sequences that fit
on chip, while cuDNN's per-step GEMMs grow sub-linearly in the batch; on the
CPU nn.LSTM runs oneDNN's fused LSTM. The CUDA limits below are the largest
batches at which ours was at least as fast as the torch module in the same
run, eager, T in {16, 64, 256} (NVIDIA H200, torch 2.11, cuDNN 9.19:
bench/results/sweep_NVIDIA_H200.json and NVIDIA_H200.json; bench/NOTES.md
steps 43 and 45 have the figures); the CPU's rule is by call length (one
2-thread CPU: bench/results/cpu.json and sweep_cpu.handover.json, NOTES step
90). Other GPUs and CPUs were not measured: the same limits apply there.

``PRNN_TORCH_FALLBACK=0`` in the environment turns the hand-over off (every
call on the persistent kernels), for measuring them.
"""

import functools
import os

import torch
from torch import nn

_INF = float("inf")

# (largest hidden size, largest batch on the persistent kernels) rows, in
# increasing hidden size; the first row whose hidden size is at least H
# decides; past the last row (the gated cells' stepwise tier) torch runs.
_CUDA_LIMITS = {
    # Elman, float32: the cluster tier holds H <= 768 up to B = 128 (1.35-2.0x
    # at B = 128 H = 512); elsewhere ours fell below nn.RNN at B * H ~ 64K.
    # Past H = 2048 one launch a step runs: 0.1-1.0x nn.RNN at every B <= 16
    # (H 2560-4096, bench/bench.py --large, bench/results/NVIDIA_H200.large.json).
    ("rnn", "float32", False): ((384, 32), (768, 128), (1536, 32), (2048, 16)),
    ("rnn", "float32", True): ((384, 32), (768, 128), (1536, 32), (2048, 16)),
    # Elman, 16-bit: tensor-core kernels. The clusters the GPU holds run a
    # large batch in waves: at H = 1024 ahead to B = 256 (1.3-2.1x) and behind
    # from B = 512 (forward 0.67-0.91x, B = 1024 0.45-0.83x); in float16 at
    # H = 256 behind from B = 256 at T = 16 (0.92x) and from B = 512 at every T
    # (0.64-0.97x; cuDNN's float16 there is its persistent kernel), bfloat16
    # there ahead at every B (3.2-4.8x at B = 512-1024); H = 512 ahead at every
    # B in both (1.1-2.6x at B = 1024). H 1025-1536 was not swept: its limit
    # lies between those of H = 1024 and 2048. H = 2048 B = 32 even
    # (0.98-1.04), B = 64 0.4-0.6x. H 2560-3072 (W_hh in shared memory):
    # 1.5-1.8x at B = 8, 0.7-1.0x at B = 16, forward and training (cluster
    # tier off: 1.1-1.5x, 0.5-0.7x); H = 4096 (one launch a step) 0.1-1.0x.
    ("rnn", "bfloat16", False): ((512, _INF), (1024, 256), (1536, 64), (2048, 16), (3072, 8)),
    ("rnn", "bfloat16", True): ((512, _INF), (1024, 256), (1536, 64), (2048, 16), (3072, 8)),
    ("rnn", "float16", False): ((256, 128), (512, _INF), (1024, 256), (1536, 64), (2048, 16), (3072, 8)),
    ("rnn", "float16", True): ((256, 128), (512, _INF), (1024, 256), (1536, 64), (2048, 16), (3072, 8)),
    # LSTM: ours below nn.LSTM from B * H = 32K (B = 64 H = 512: 0.84-0.94x,
    # B = 32 H = 1024: 0.43-0.67x); float32 at H = 1024 already at B = 16
    # (training 0.77x; forward 0.90-0.95x at T = 256 in two runs, 1.08x at
    # T = 64; packed 0.77-0.84x).
    ("lstm", "float32", False): ((384, 64), (768, 32), (1024, 8)),
    ("lstm", "float32", True): ((384, 64), (768, 32), (1024, 8)),
    ("lstm", "bfloat16", False): ((384, 64), (768, 32), (1024, 16)),
    ("lstm", "bfloat16", True): ((384, 64), (768, 32), (1024, 16)),
    # float16 LSTM where cuDNN runs its persistent kernel (cudnn_persistent_lstm):
    # from B = 8 (0.3-0.6x at every H). Elsewhere cuDNN's float16 LSTM is its
    # per-step algorithm, as in bfloat16, and bfloat16's limits apply (B = 5,
    # 6, 12 at H 768-1024, T 64-256: ours 3.0-7.2x, NVIDIA H100, step 92).
    ("lstm", "float16", False): ((1024, 4),),
    ("lstm", "float16", True): ((1024, 4),),
    # GRU: as the LSTM (B = 64 H = 512: 0.75-0.99x; B = 32 H = 1024: 0.61-0.81x).
    ("gru", "float32", False): ((384, 64), (768, 32), (1024, 16)),
    ("gru", "float32", True): ((384, 64), (768, 32), (1024, 16)),
    ("gru", "16-bit", False): ((384, 64), (768, 32), (1024, 16)),
    ("gru", "16-bit", True): ((384, 64), (768, 32), (1024, 16)),
}

# Short calls where nn's fixed cost is below ours (cell, dtype class,
# training) -> (largest hidden size, largest batch on ours, fewest steps):
# at most that hidden size, a call past that batch and shorter than those
# steps runs torch. float16 Elman at H = 256 (cuDNN's float16 persistent
# kernel): forward at T = 16 0.85-0.93x nn.RNN at B = 32-128 (1.33x at
# B = 16), at T = 64 0.99-1.10x, at T = 256 1.10-1.29x; training 1.06-1.11x
# at T = 16 (bench/NOTES.md step 74).
_SHORT_CALL_LIMITS = {
    ("rnn", "float16", False): ((256, 16, 64),),
}

# One timestep a call without gradients on the few-steps kernel, as measured
# against nn's modules (bench/NOTES.md, one timestep a call).
_FEW_STEPS_MAX_BATCH = 16
_FEW_STEPS_MAX_HIDDEN = {"rnn": 2048, "lstm": 1024, "gru": 1024}

# The 16-bit gated cells where their cluster family runs (compute capability
# 9.0 or later, the cluster tier not disabled), keyed as _CUDA_LIMITS: at
# H <= 512 it holds 8 sequences a cluster on 7 clusters at H > 256 (forward
# 1.5-2.2 us a step at B = 32, 8-10x nn.LSTM) and took B = 64 at H = 256
# (2.0 us, 11x); float16 LSTM forwards beat cuDNN's persistent kernel eager
# from B = 8 (1.5 against 1.9 us at H = 256). Training, eager, T = 256:
# 4.3-8.4x nn.LSTM in bfloat16 and 1.3-3.5x in float16 (cuDNN's persistent
# kernel) at B = 16-56, H 256-512, GRU 5.4-9.3x; at B = 64 H = 512 (past the
# clusters the GPU holds) 0.3-0.7x. float16 LSTMs where cuDNN runs its
# persistent kernel, at H 513-1024 (NVIDIA H100, T 64-256, bench/NOTES.md
# step 92): forward ours 1.08-1.42x at B = 8, 0.82-0.88x at B = 16; training
# at B = 8 0.92-1.24x.
_CLUSTER_LIMITS = {
    ("lstm", "bfloat16", False): ((256, 64), (512, 56), (768, 32), (1024, 16)),
    ("lstm", "bfloat16", True): ((256, 64), (512, 56), (768, 32), (1024, 16)),
    ("lstm", "float16", False): ((512, 56), (1024, 8)),
    ("lstm", "float16", True): ((512, 56), (1024, 4)),
    ("gru", "16-bit", False): ((256, 64), (512, 56), (768, 32), (1024, 16)),
    ("gru", "16-bit", True): ((256, 64), (512, 56), (768, 32), (1024, 16)),
}

# On the CPU (two threads, eager, bench/results/sweep_cpu.handover.json,
# bench/NOTES.md step 90) nn.LSTM in float32 without a projection on padded
# input runs oneDNN's LSTM, ahead of our ATen steps from a few steps a call
# (T = 16: forward 0.54-0.82x ours, training 0.74-1.09x but 0.93-2.35x at
# H = 1024; T = 256: forward 0.14-0.67x, training 0.27-1.05x) and behind
# in the shortest calls, where its weights' preparation costs more than the
# steps: up to four steps with gradients ours 0.97-4.65x (1.02x or more but
# at H = 256 B = 16), up to 16 at H = 1024 B <= 4 1.23-4.13x; up to two
# without, 1.11-1.43x below H = 256 where B * H <= 1024 and 1.15-7.4x at
# B = 1 (0.68-1.03x at H 256-1024 from B = 4). Elsewhere nn.LSTM runs ATen's
# steps, as ours, and ours is ahead in training: with a projection 1.4-4.0x
# (H 64-1024), in 16 bits (no oneDNN on this CPU) 3.0-7.7x (H 64-1024; ours
# in float32 inside), on packed input 1.16-3.2x (H 64-1024); forwards there
# ours 1.0-1.64x below H = 512, 0.59-0.91x from it. Elman and GRU on padded
# input: ours at least even (0.98-1.9x forward, 1.3-8.3x training at H 16-1024).
_CPU_OURS_MAX_STEPS = 2  # forwards on oneDNN's side
_CPU_SMALL_HIDDEN = 256
_CPU_SMALL_BATCH_HIDDEN = 1024
_CPU_OURS_MAX_TRAINING_STEPS = 4
_CPU_LARGE_HIDDEN = 1024  # and training calls of up to 16 steps at B <= 4 from this H
_CPU_ATEN_TORCH_MIN_HIDDEN = 512  # forwards where nn runs ATen's steps
# bfloat16 on a CPU where nn.LSTM runs oneDNN's bfloat16 LSTM (AVX512-BF16 or
# AMX; bench/NOTES.md step 95, T 1-256, B 1/16): its forwards 1.1-4.5x ours
# (ours ahead at one point, T = 1 B = 1 H = 1024); training 1.1-2.1x ours
# below H = 1024 from 64 steps, or at B = 16 (ours 1.04-4.0x at H = 1024, and
# 1.1-3.9x up to 16 steps at B = 1 from H = 256).
_CPU_BF16_OURS_MIN_TRAINING_HIDDEN = 1024
# Packed float32 forwards of the other cells (bench/NOTES.md steps 93-94, B
# 4-16, T 64-256): nn's packed recurrence steps only the live rows and
# projects only the packed ones, ours pads first. GRU ours 0.88-1.04x nn's
# from H = 256 (0.99-1.10x at 128), Elman 0.80-1.01x from H = 512
# (0.97-1.13x at 256, 1.09-1.47x below).
_CPU_PACKED_TORCH_MIN_HIDDEN = {"gru": 256, "rnn": 512}

enabled = os.environ.get("PRNN_TORCH_FALLBACK", "1") != "0"

# The cell of each nn.RNNBase mode, as torch_runs names it, and its gates
# (W_hh's rows in hidden sizes).
CELL_OF_MODE = {"RNN_TANH": "rnn", "RNN_RELU": "rnn", "LSTM": "lstm", "GRU": "gru"}
GATES_OF_CELL = {"rnn": 1, "lstm": 4, "gru": 3}

# The recurrence nn's forward of each mode calls (looked up once: torch._VF's
# attribute lookup is a Python __getattr__).
_VF_OF_MODE = {"RNN_TANH": torch._VF.rnn_tanh, "RNN_RELU": torch._VF.rnn_relu, "LSTM": torch._VF.lstm,
               "GRU": torch._VF.gru}


def flatten_parameters(module) -> None:
    """nn.RNNBase.flatten_parameters on a module of ours: on CUDA, its
    parameters become views of one buffer in cuDNN's layout, so that the
    calls handed to cuDNN take them as they are. bfloat16 too, which nn's
    leaves as it is (torch.backends.cudnn.is_acceptable has no bfloat16),
    so that cuDNN would compact nn's bfloat16 weights into a new buffer on
    every call, with its "not part of single contiguous chunk of memory"
    warning: cuDNN runs bfloat16 RNNs, and that compaction is this same
    flattening (H200: a bfloat16 cuDNN forward at T = 64 on flattened
    weights took 0.72-0.78 of the time of one that compacts, bench/NOTES.md
    step 46)."""
    nn.RNNBase.flatten_parameters(module)  # type: ignore[arg-type]
    weights = module._flat_weights
    if (
        not weights
        or len(weights) != len(module._flat_weights_names)
        or not all(isinstance(w, torch.Tensor) and w.dtype == torch.bfloat16 and w.is_cuda for w in weights)
        or torch.version.hip is not None  # MIOpen: left to nn's
        or not torch._C._get_cudnn_enabled()
        or not torch.backends.cudnn.is_available()
        or len({w.data_ptr() for w in weights}) != len(weights)  # aliased: nn's copying path
        or not torch._use_cudnn_rnn_flatten_weight()
    ):
        return
    from torch.backends.cudnn import rnn

    # nn's own call, in nn's words (torch/nn/modules/rnn.py, flatten_parameters).
    with torch.cuda.device_of(weights[0]), torch.no_grad():
        torch._cudnn_rnn_flatten_weight(
            weights, (4 if module.bias else 2) + (1 if module.proj_size > 0 else 0), module.input_size,
            rnn.get_cudnn_mode(module.mode), module.hidden_size, module.proj_size, module.num_layers,
            module.batch_first, bool(module.bidirectional),
        )


def run_torch(module, x, batch_sizes, hx, weights, batch_first: bool = False):
    """The call nn.RNN / nn.LSTM / nn.GRU.forward makes, with module's
    configuration: x [T, B, I] ([B, T, I] with batch_first), or a packed
    sequence's data with its batch_sizes; hx: h, or an LSTM's (h, c), each
    [layers * directions, B, size]; weights: the parameters in nn's order
    (_flat_weights_names), which on CUDA are views of the buffer
    flatten_parameters made, so cuDNN takes them without a copy. Returns
    torch._VF's tuple: (output, h_n), an LSTM's (output, h_n, c_n)."""
    run = _VF_OF_MODE[module.mode]
    if batch_sizes is None:
        return run(x, hx, weights, module.bias, module.num_layers, module.dropout, module.training,
                   module.bidirectional, batch_first)
    return run(x, batch_sizes, hx, weights, module.bias, module.num_layers, module.dropout, module.training,
               module.bidirectional)


def _dtype_class(cell: str, dtype: torch.dtype) -> str:
    if cell == "gru":
        return "float32" if dtype == torch.float32 else "16-bit"
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]


def _index_of(device_index: int | None) -> int:
    """A CUDA device's index, the current device's for None."""
    if device_index is not None:
        return device_index
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


_CUDNN_SMALL_HIDDEN_LSTM = 192  # unmeasured there: float16's limits stay


@functools.lru_cache(maxsize=None)
def _cudnn_persistent_device(index: int) -> bool:
    """Whether ATen lets cuDNN's persistent RNN kernel run on CUDA device
    `index` (aten/src/ATen/native/cudnn/RNN.cpp, use_persist_device_heuristics:
    compute capability 8.0 or later but x.6, at least 98 SMs)."""
    if not torch.cuda.is_available():
        return False
    props = torch.cuda.get_device_properties(index)
    return props.major >= 8 and props.minor != 6 and props.multi_processor_count >= 98


def cudnn_persistent_lstm(batch: int, hidden: int, input_size: int | None, layers: int, bidirectional: bool,
                          packed: bool, device_index: int) -> bool:
    """Whether nn.LSTM's float16 call runs one of cuDNN's persistent kernels,
    as ATen's get_algo chooses them (RNN.cpp: on padded input, the
    small-hidden one at hidden <= 192; else one layer, one direction, hidden
    and input sizes multiples of 128 with hidden <= 1024, a batch a multiple
    of 8 up to 128, on a device it allows). Elsewhere cuDNN runs its
    per-step algorithm. input_size None: as hidden."""
    input_size = hidden if input_size is None else input_size
    if packed:
        return False
    if hidden <= _CUDNN_SMALL_HIDDEN_LSTM:
        # ATen's get_algo takes cuDNN's small-hidden persistent algorithm first
        # (forward to 192, backward to 128), whatever the batch, layers or direction.
        return True
    return (layers == 1 and not bidirectional and hidden <= 1024 and hidden % 128 == 0
            and input_size % 128 == 0 and batch % 8 == 0 and batch <= 128 and _cudnn_persistent_device(device_index))


@functools.lru_cache(maxsize=None)
def _cluster_family_runs(index: int) -> bool:
    """Whether the gated cluster family can run on CUDA device `index` (as
    the C planner decides it, PRNN_DISABLE_CLUSTER_TIER read once)."""
    knob = os.environ.get("PRNN_DISABLE_CLUSTER_TIER", "")
    return knob in ("", "0") and torch.cuda.is_available() and torch.cuda.get_device_capability(index) >= (9, 0)


# A CPU with oneDNN's bfloat16 kernels (AVX512-BF16 or AMX), queried once.
_CPU_HAS_ONEDNN_BFLOAT16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _cpu_onednn_bfloat16() -> bool:
    """Whether nn.LSTM's bfloat16 call on the CPU runs oneDNN's LSTM (ATen's
    use_mkldnn: such a CPU, and oneDNN enabled, which compiled code takes
    as on: torch.compile cannot trace the flag's query)."""
    if not _CPU_HAS_ONEDNN_BFLOAT16:
        return False
    return torch.compiler.is_compiling() or torch._C._get_mkldnn_enabled()


def cpu_torch_runs(cell: str, dtype: torch.dtype, batch: int, hidden: int, proj_size: int, training: bool,
                   steps: int | None, packed: bool = False) -> bool:
    """torch_runs' rule on the CPU (float32 or 16 bits, no autocast): nn.LSTM
    where it is faster (the limits above; a call of unknown steps counts as a
    long one), and nn.GRU's / nn.RNN's packed forwards from the sizes above."""
    if cell != "lstm":
        return packed and not training and dtype == torch.float32 and hidden >= _CPU_PACKED_TORCH_MIN_HIDDEN[cell]
    if dtype == torch.bfloat16 and proj_size == 0 and not packed and _cpu_onednn_bfloat16():
        if not training:
            return True
        short = steps is not None and steps <= 16 and batch == 1 and hidden >= _CPU_SMALL_HIDDEN
        return not (hidden >= _CPU_BF16_OURS_MIN_TRAINING_HIDDEN or short)
    if proj_size > 0 or dtype != torch.float32 or (packed and training):
        return not training and hidden >= _CPU_ATEN_TORCH_MIN_HIDDEN
    if steps is None:
        return True
    if training:
        return not (steps <= _CPU_OURS_MAX_TRAINING_STEPS
                    or steps <= 16 and hidden >= _CPU_LARGE_HIDDEN and batch <= 4)
    if steps > _CPU_OURS_MAX_STEPS:
        return True
    small = hidden < _CPU_SMALL_HIDDEN and batch * hidden <= _CPU_SMALL_BATCH_HIDDEN
    return not (batch == 1 or small)


def torch_runs(cell: str, dtype: torch.dtype, device_type: str, batch: int, hidden: int,
                    proj_size: int = 0, training: bool = False, device_index: int | None = None,
                    steps: int | None = None, layers_op: bool = False, packed: bool = False,
                    input_size: int | None = None, layers: int = 1, bidirectional: bool = False) -> bool:
    """Whether a module call of this cell ("rnn", "lstm", "gru"), dtype,
    device, batch and hidden size runs on torch's own recurrence: where that
    is faster, and on the CPU under autocast; training: the call's backward
    runs too. float64 always stays on ours (the reference the tests use), as
    does every device but CUDA and the CPU, and under torch.compile a CPU
    call with gradients. device_index: the CUDA device
    (default: the current one). steps: the call's timesteps, where the
    caller knows them (a short call may hand over from a smaller batch:
    _SHORT_CALL_LIMITS). layers_op: the call's layers run as prnn::layers
    (the modules' short path), where one timestep a call without gradients
    at B <= 16 takes the few-steps kernel and stays ours where measured (the
    gated cells 1.9-2.0x nn's at H = 640-1024 in float32 and bfloat16, not
    timed in float16; Elman to H = 2048). packed: PackedSequence input (on
    the CPU nn's packed LSTM runs ATen's steps). input_size, layers,
    bidirectional: the module's (a float16 LSTM's cuDNN algorithm depends on
    them; input_size None: as hidden)."""
    if not enabled:
        return False
    if device_type == "meta":
        # Shapes only: under autocast nn's meta kernels take what its real
        # ones would cast (a float64 input beside float32 weights), which
        # ours refuse as their real kernels do; torch runs, so the shapes and
        # dtypes are nn's.
        return torch._C._is_any_autocast_enabled()
    if dtype == torch.float64:
        return False
    if device_type == "cpu" and (training or packed) and torch.compiler.is_compiling():
        # Not traceable there: the CPU's oneDNN LSTM with gradients (its
        # aten.mkldnn_rnn_layer takes the parameters as saved tensors), and
        # nn's packed recurrences (batch_sizes read as data: a fullgraph
        # compile fails on a data-dependent guard).
        return False
    if device_type == "cpu":
        # Under CPU autocast nn's recurrences mix the autocast dtype and
        # float32 in their own ways (nn.GRU: 16-bit GEMMs, float32 state and
        # results; nn.LSTM: 16-bit results on padded input, float32 on packed
        # input or with proj_size): torch runs them, so the results are nn's.
        if torch.is_autocast_enabled("cpu"):
            return True
        return cpu_torch_runs(cell, dtype, batch, hidden, proj_size, training, steps, packed)
    if device_type != "cuda" or dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    autocast = torch.is_autocast_enabled("cuda")
    if autocast and torch.get_autocast_dtype("cuda") in (torch.float16, torch.bfloat16):
        # The call computes in 16 bits: ours in the autocast dtype (ops.py's
        # rule, both 16-bit dtypes at about one speed), nn's on cuDNN in
        # float16 whatever the autocast dtype (its autocast wrapper casts to
        # it): float16's limits, measured ours against cuDNN in float16.
        dtype = torch.float16
    if proj_size > 0:  # our stepwise tier
        return True
    if (layers_op and steps == 1 and not training and not autocast and batch <= _FEW_STEPS_MAX_BATCH
            and hidden <= _FEW_STEPS_MAX_HIDDEN[cell] and (cell == "rnn" or dtype != torch.float16)):
        return False
    if steps is not None:
        for max_hidden, max_batch, min_steps in _SHORT_CALL_LIMITS.get((cell, _dtype_class(cell, dtype), training), ()):
            if hidden <= max_hidden and batch > max_batch and steps < min_steps:
                return True
    if cell == "lstm" and dtype == torch.float16 and not cudnn_persistent_lstm(
            batch, hidden, input_size, layers, bidirectional, packed, _index_of(device_index)):
        dtype = torch.bfloat16  # cuDNN's per-step algorithm, as in bfloat16
    limits = _CUDA_LIMITS[(cell, _dtype_class(cell, dtype), training)]
    if cell != "rnn" and dtype != torch.float32:
        if _cluster_family_runs(_index_of(device_index)):
            limits = _CLUSTER_LIMITS[(cell, _dtype_class(cell, dtype), training)]
    for max_hidden, max_batch in limits:
        if hidden <= max_hidden:
            return batch > max_batch
    return True


def needs_grad(weights, *tensors) -> bool:
    """Whether a call's backward can run: grad mode on and any of its tensors
    (None: absent) requiring grad."""
    if not torch.is_grad_enabled():
        return False
    return any(t.requires_grad for t in weights) or any(t is not None and t.requires_grad for t in tensors)
