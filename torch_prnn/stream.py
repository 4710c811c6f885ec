"""Stream: a recurrent module's layers resident on the GPU, one timestep a call."""

import atexit
import numbers
import weakref

import torch
from torch import Tensor, nn

from . import _C
from ._crossover import GATES_OF_CELL
from .rnn import PersistentRNN

_step_raw = _C._stream_step
_empty_like = torch.empty_like
_TIMEOUT_MARK = "no answer within"  # how the message of a wait that timed out goes on
_START_TIMEOUT_MARK = "(start_timeout)"  # in the message of a kernel that did not start in time
_MAX_LAYERS = 8
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_CELL_OF_GATES = {gates: cell for cell, gates in GATES_OF_CELL.items()}
_ACTIVATION_OF_MODE = {"RNN_TANH": "tanh", "RNN_RELU": "relu"}

# Open streams, closed at interpreter exit (a stream also closes when collected).
_open_streams = weakref.WeakSet()


class Stream:
    """A recurrent module's layers kept resident on a CUDA GPU, answering one
    timestep a call at the cost of one step::

        rnn = torch_prnn.PersistentRNN(64, 1024, device="cuda").eval()
        with torch_prnn.Stream(rnn, batch=1) as stream:
            for x_t in sensor:                 # x_t: [batch, input_size] (or [input_size])
                y_t = stream.step(x_t)         # the top layer's h_t: [batch, hidden_size]

    Opening launches one persistent kernel for all the module's layers; each
    of its CTAs (one an SM) holds its hidden units' rows of W_ih and W_hh in
    shared memory, and the state (h, and an LSTM's c) stays on the GPU between
    steps. ``step`` copies ``x_t`` to pinned host memory, signals the kernel
    and waits for its answer: no kernel launch per call. For 100 µs after an
    answer the kernel reads a small ``x_t`` (up to 8 KiB) with every look at
    the request, so steps taken in a loop save one transfer over the bus
    (meanwhile it reads those bytes over and over). ``stream.step(x_t)``
    gives what ``module(x_t.unsqueeze(0), h)[0][0]`` gives with the state
    carried, within float32 rounding (the input projection is done in the
    kernel, not by a GEMM; 16-bit values round as the module's do).

    Args:
        module: ``torch_prnn.PersistentRNN``, ``torch.nn.RNN``, ``nn.LSTM``
            or ``nn.GRU`` (or a module with their parameters and attributes),
            unidirectional, float32 / bfloat16 / float16, at most 8 layers, no
            ``proj_size``. Its weights are copied onto the chip when the stream
            opens: later changes to them are not seen until :meth:`refresh`.
            Dropout is not applied (the module's eval-mode function).
        batch: sequences stepped together (B >= 1).
        device: the CUDA device to run on; default the module's (a module on
            the CPU needs ``device``: its weights are copied there).
        timeout: seconds a command may wait for the kernel's answer before
            :class:`TimeoutError` (the stream is then unusable: close it).
        start_timeout: seconds opening may wait for the kernel to start (its
            launch waits until the SMs it needs are free of other work)
            before :class:`TimeoutError`.
        max_sms: the most SMs the stream may hold (default: as many as suit
            its size, at most the free ones; one SM of the device always
            stays free for other work).

    The kernel holds only the SMs its CTAs need (:attr:`sms`); other kernels
    keep running on the GPU beside it, but a launch that needs more SMs at
    once than are free (other cooperative or cluster kernels) waits for them:
    leave room with ``max_sms``. torch_prnn's own layers on the device run on
    their tiers of plain launches while a stream is open (one or a few
    launches a step, slower than the persistent tiers, which would wait for
    the SMs the stream holds). That holds for calls made while it is open:
    persistent launches queued on other CUDA streams before it opens, or
    replayed from a CUDA graph captured before, still wait (synchronise them
    first), and so do calls a module hands to cuDNN (large batches) where
    cuDNN picks its persistent algorithm (float16). Opening a stream that
    does not fit beside the open ones of this process raises before
    launching. While a stream is open,
    device-wide synchronisation waits for it, since its kernel only ends when
    the stream closes: ``torch.cuda.synchronize()``,
    ``torch.cuda.empty_cache()`` (and anything else that calls
    ``cudaDeviceSynchronize`` or ``cudaFree``) block until then - synchronise
    streams or events instead. So does the first launch of any kernel in the
    process under CUDA's lazy loading (``CUDA_MODULE_LOADING=LAZY``, the
    default), which waits for the device to be idle: a kernel that has not run
    yet in the process (a torch op on a new dtype or shape, a module's first
    forward) hangs beside an open stream. Run what will run beside a stream
    once before opening it, or set ``CUDA_MODULE_LOADING=EAGER`` before CUDA
    initialises. Opening loads the kernels of torch_prnn's plain tiers, so
    that a module whose forward ran once before runs beside the stream (an
    Elman layer's input projection in its step kernel, the gated cells' in
    the GEMM that ran before; training needs its backward run once too). The
    stream itself launches nothing while it is open: GPU
    tensors in and out of its methods move by plain copies. Closing (:meth:`close`, leaving a ``with``
    block, garbage collection or interpreter exit) ends the kernel. Inference
    only: no autograd.
    """

    def __init__(self, module: nn.Module, batch: int = 1, *, device=None, timeout: float = 1.0,
                 start_timeout: float = 10.0, max_sms: int | None = None) -> None:
        self._port = None  # so that __del__ works on a stream that failed to open
        # Ports that refresh() replaced, closed but kept: a step in another thread may still hold one's handle.
        self._retired = []
        description = _describe(module)
        if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch < 1:
            raise ValueError(f"Stream: batch must be an integer >= 1, got {batch!r}")
        for name, value in (("timeout", timeout), ("start_timeout", start_timeout)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
                raise ValueError(f"Stream: {name} must be a number of seconds > 0, got {value!r}")
        if max_sms is not None and (isinstance(max_sms, bool) or not isinstance(max_sms, numbers.Integral)
                                    or max_sms < 1):
            raise ValueError(f"Stream: max_sms must be None or an integer >= 1, got {max_sms!r}")
        cell, nonlinearity, layers, input_size, hidden_size, bias, dtype, weights = description
        device = self._device_for(weights[0].device, device)
        self._module, self._batch, self._device, self._dtype, self._bias = module, int(batch), device, dtype, bias
        self._cell = _cell_name(cell, nonlinearity)
        self._layers, self._input_size, self._hidden_size = layers, input_size, hidden_size
        self._options = dict(timeout=float(timeout), start_timeout=float(start_timeout), max_sms=max_sms)
        self._open(description)
        # Output prototypes by the input's number of dimensions: the hot path of step.
        self._y_protos = {2: torch.empty(self._batch, hidden_size, dtype=dtype)}
        if self._batch == 1:
            self._y_protos[1] = torch.empty(hidden_size, dtype=dtype)
        _open_streams.add(self)

    def _open(self, description) -> None:
        """Makes a new port the stream's and launches its kernel with the
        module's weights (`description`: _describe's)."""
        cell, nonlinearity, layers, input_size, hidden_size, bias, dtype, weights = description
        if self._port is not None:
            self._retired.append(self._port)
        self._port = torch.classes.prnn.ResidentStream(cell, nonlinearity, layers, self._batch, input_size,
                                                       hidden_size, dtype, self._device.type == "cuda",
                                                       self._options["timeout"])
        try:
            self._plan = self._launch([w.detach().to(self._device) for w in weights], bias, self._device,
                                      self._options["max_sms"] or 0, self._options["start_timeout"])
        except RuntimeError as error:
            self._port.close()
            raise _translated(error) from None
        except BaseException:
            self._port.close()
            raise
        self._handle = self._port.handle()

    @staticmethod
    def _device_for(weight_device: torch.device, device) -> torch.device:
        """The CUDA device the stream runs on (an index always)."""
        if device is None:
            if weight_device.type != "cuda":
                raise ValueError(
                    f"Stream: the module is on {weight_device}; a stream runs on a CUDA GPU: move the module "
                    "(module.cuda()) or pass device='cuda'"
                )
            device = weight_device
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"Stream: device must be a CUDA device, got {device}")
        if not torch.cuda.is_available():
            raise RuntimeError("Stream: CUDA is not available")
        return torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())

    def _launch(self, weights, bias, device, max_sms, start_timeout):
        """Starts the resident kernel; returns its plan [grid, block, units_per_cta, smem_bytes]."""
        return self._port.launch(weights, bias, device.index, max_sms, start_timeout)

    # ---- stepping ----------------------------------------------------------

    def step(self, x: Tensor, out: Tensor | None = None) -> Tensor:
        """One timestep of every layer: ``x`` ``[batch, input_size]`` (or
        ``[input_size]`` for a batch of one), of the module's dtype, on the
        CPU or the stream's GPU. Returns the top layer's ``h_t``
        ``[batch, hidden_size]`` (or ``[hidden_size]``) on ``x``'s device, or
        writes it into ``out`` and returns ``out`` (on the GPU ``out`` must be
        dense: a strided write there would take a kernel). Contiguous CPU
        tensors are the fastest path (``out=`` saves the allocation)."""
        try:
            # Plain tensors: _step_raw checks the rest (on the CPU, dtype, shape, contiguous) and steps, or
            # declines.
            if x.__class__ is Tensor:
                if out is None:
                    proto = self._y_protos.get(x.ndim)
                    if proto is not None:
                        y = _empty_like(proto)
                        if _step_raw(self._handle, x._cdata, y._cdata):
                            return y
                elif out.__class__ is Tensor and _step_raw(self._handle, x._cdata, out._cdata):
                    return out
            # Anything else (on the GPU, not contiguous, or wrong): checked and copied in C++.
            if not isinstance(x, Tensor):
                raise TypeError(f"Stream.step: x must be a tensor, got {type(x).__name__}")
            if out is None:
                return self._port.step(x)
            if not isinstance(out, Tensor):
                raise TypeError(f"Stream.step: out must be a tensor or None, got {type(out).__name__}")
            return self._port.step_into(x, out)
        except RuntimeError as error:
            raise _translated(error) from None

    # ---- state -------------------------------------------------------------

    @property
    def state(self):
        """The state now: ``h`` ``[num_layers, batch, hidden_size]`` (an LSTM:
        ``(h, c)``), of the module's dtype on the stream's device, as
        ``module(...)`` returns ``h_n``. An LSTM's c is kept in float32 on the
        GPU and rounded here."""
        tensors = [t.to(device=self._device, dtype=self._dtype) for t in self._call(self._port.get_state)]
        return tuple(tensors) if self._cell == "lstm" else tensors[0]

    def set_state(self, state) -> None:
        """Sets the state: ``h`` ``[num_layers, batch, hidden_size]`` (an
        LSTM: ``(h, c)``) on the CPU or the stream's device, rounded to the
        module's dtype (an LSTM's c is kept in float32)."""
        if self._cell == "lstm":
            if not isinstance(state, (tuple, list)) or len(state) != 2:
                got = (f"a {type(state).__name__} of {len(state)}" if isinstance(state, (tuple, list))
                       else type(state).__name__)
                raise TypeError(f"Stream.set_state: an LSTM's state is a pair (h, c), got {got}")
            tensors = list(state)
            for name, t in zip("hc", tensors):
                if not isinstance(t, Tensor):
                    raise TypeError(f"Stream.set_state: {name} must be a tensor, got {type(t).__name__}")
        else:
            if not isinstance(state, Tensor):
                raise TypeError(f"Stream.set_state: the state of a {self._cell} stream is a tensor h "
                                f"[num_layers, batch, hidden_size], got {type(state).__name__}")
            tensors = [state]
        self._call(self._port.set_state, tensors)

    def reset(self, mask=None) -> None:
        """Zeroes the state of the sequences where ``mask`` (bool ``[batch]``,
        a tensor or a sequence) is true; of every sequence without a mask."""
        if mask is None:
            mask = torch.ones(self._batch, dtype=torch.bool)
        elif not isinstance(mask, Tensor):
            mask = torch.as_tensor(mask)
        self._call(self._port.reset, mask)

    # ---- life --------------------------------------------------------------

    def refresh(self) -> None:
        """Re-reads the module's weights: closes the stream and opens it again
        (same batch, device and options), keeping the state. The module must
        still have the stream's cell, sizes, bias and dtype. If opening again
        fails, the stream stays closed."""
        if self.closed:
            raise RuntimeError("Stream.refresh: the stream is closed")
        description = _describe(self._module)
        cell, nonlinearity, layers, input_size, hidden_size, bias, dtype, _ = description
        now = (_cell_name(cell, nonlinearity), layers, input_size, hidden_size, bias, dtype)
        then = (self._cell, self._layers, self._input_size, self._hidden_size, self._bias, self._dtype)
        if now != then:
            raise ValueError(f"Stream.refresh: the module changed from (cell, num_layers, input_size, hidden_size, "
                             f"bias, dtype) = {then} to {now}; open a new stream for it")
        state = self.state
        self.close()
        self._open(description)
        self.set_state(state)

    def close(self) -> None:
        """Ends the kernel and frees what the stream holds (idempotent).
        Raises if the kernel did not end within the timeout: its SMs and
        memory then stay held until the process exits."""
        _open_streams.discard(self)
        if self._port is not None:
            self._port.close()

    @property
    def closed(self) -> bool:
        """Whether the stream was closed. A stream broken by a timeout is not
        closed until :meth:`close`: its kernel may still hold its SMs."""
        return self._port is None or self._port.is_closed()

    def __enter__(self) -> "Stream":
        if self.closed:
            raise RuntimeError("Stream: the stream is closed")
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __copy__(self):
        raise TypeError("Stream: a stream cannot be copied (its kernel and state are its own); open another")

    def __deepcopy__(self, memo):
        self.__copy__()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to raise into while being collected
            pass

    def _call(self, method, *args):
        try:
            return method(*args)
        except RuntimeError as error:
            raise _translated(error) from None

    # ---- what it runs ------------------------------------------------------

    @property
    def batch(self) -> int:
        return self._batch

    @property
    def input_size(self) -> int:
        return self._input_size

    @property
    def hidden_size(self) -> int:
        return self._hidden_size

    @property
    def num_layers(self) -> int:
        return self._layers

    @property
    def cell(self) -> str:
        """``'rnn_tanh'``, ``'rnn_relu'``, ``'lstm'`` or ``'gru'``."""
        return self._cell

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def sms(self) -> int:
        """SMs the stream's kernel holds (one CTA each); 0 once closed."""
        return self._port.ctas() if not self.closed else 0

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"sms={self.sms}" if self._port.is_open() else "broken"
        return (f"Stream({self._cell}, input_size={self._input_size}, hidden_size={self._hidden_size}, "
                f"num_layers={self._layers}, batch={self._batch}, dtype={self._dtype}, device={self._device}, "
                f"{state})")


def _cell_name(cell: str, nonlinearity: str) -> str:
    """The stream's cell as its `cell` property names it."""
    return f"rnn_{nonlinearity}" if cell == "rnn" else cell


def _translated(error: RuntimeError) -> Exception:
    """A wait that timed out ("Stream.<what>: no answer within ...", or a
    kernel that did not start within start_timeout) as TimeoutError; other
    errors as they are."""
    message = str(error)
    timed_out = message.split(": ", 1)[-1].startswith(_TIMEOUT_MARK) or _START_TIMEOUT_MARK in message
    return TimeoutError(message) if timed_out else error


def _describe(module):
    """(cell, nonlinearity, num_layers, input_size, hidden_size, bias, dtype,
    weights [w_ih, w_hh(, b_ih, b_hh)] a layer) of an RNN module, or a clear
    error for what cannot stream."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"Stream: module must be a torch.nn.Module, got {type(module).__name__}")
    name = type(module).__name__
    try:
        layers, hidden_size, input_size = module.num_layers, module.hidden_size, module.input_size
        w_hh = module.weight_hh_l0
    except AttributeError as error:
        raise TypeError(f"Stream: {name} is not a recurrent module of nn.RNN's kind ({error})") from None
    if isinstance(module, nn.LSTM):
        cell = "lstm"
    elif isinstance(module, nn.GRU):
        cell = "gru"
    elif isinstance(module, (nn.RNN, PersistentRNN)):
        cell = "rnn"
    else:  # by the gates in W_hh's rows
        cell = _CELL_OF_GATES.get(w_hh.shape[0] // hidden_size if w_hh.shape[0] % hidden_size == 0 else 0)
        if cell is None:
            raise TypeError(f"Stream: cannot tell the cell of {name}: weight_hh_l0 is {list(w_hh.shape)}")
    if getattr(module, "bidirectional", False):
        raise ValueError("Stream: a bidirectional RNN reads the whole sequence backwards too; it cannot stream "
                         "one timestep at a time")
    if getattr(module, "proj_size", 0):
        raise NotImplementedError("Stream: an LSTM with proj_size has no resident kernel")
    if not 1 <= layers <= _MAX_LAYERS:
        raise NotImplementedError(f"Stream: at most {_MAX_LAYERS} layers stream, the module has {layers}")
    dtype = w_hh.dtype
    if dtype not in _DTYPES:
        raise NotImplementedError(f"Stream: the resident kernel runs float32, bfloat16 and float16, not {dtype}")
    # An Elman module computes by mode, as nn.RNN's forward does (nonlinearity only sets it at construction).
    nonlinearity = "tanh"
    if cell == "rnn":
        nonlinearity = _ACTIVATION_OF_MODE.get(getattr(module, "mode", None), getattr(module, "nonlinearity", "tanh"))
    bias = bool(getattr(module, "bias", True))
    kinds = ("weight_ih", "weight_hh") + (("bias_ih", "bias_hh") if bias else ())
    names = [f"{kind}_l{layer}" for layer in range(layers) for kind in kinds]
    weights = [getattr(module, weight_name) for weight_name in names]
    for weight_name, w in zip(names, weights):
        if w.dtype != dtype or w.device != w_hh.device:
            raise ValueError(f"Stream: every weight of {name} must have weight_hh_l0's dtype and device "
                             f"({dtype}, {w_hh.device}); {weight_name} is {w.dtype} on {w.device}")
    return cell, nonlinearity, layers, input_size, hidden_size, bias, dtype, weights


@atexit.register
def _close_open_streams() -> None:
    for stream in list(_open_streams):
        try:
            stream.close()
        except Exception:  # noqa: BLE001 - the process is ending; the driver ends what is left
            pass
