"""torch_prnn.Stream: a module resident on the GPU, one timestep a call.

On the CPU: the argument checks of Stream and of its host side
(torch.classes.prnn.ResidentStream), and the whole Python object against a
fake kernel - a thread that answers the mailbox as the resident kernel does,
computing the cells in float64 - so that steps, state, resets, timeouts and
closing are tested without a GPU. With CUDA: the resident kernel itself
against the whole-sequence forward, its state commands, co-residency with
other work, refusals, and closing."""
import copy
import gc
import os
import re
import threading
import time

import numpy as np
import pytest
import torch

import conftest
import torch_prnn
import torch_prnn.stream as stream_module
from conftest import TOL, rel_err, run_python

# The CUDA tests of the resident kernel (cuda_test below) each run in a child
# pytest process of their own with a time limit (test_cuda_in_a_child, at the
# end): while a stream is open, anything that waits for the device to be idle
# waits forever, so a hang must end as that test's failure, naming the case
# that hung, not stop the suite. They run when PRNN_STREAM_GPU_TESTS=1 asks
# for them (one hung inside the suite on an H200 before they were isolated).
CHILD = os.environ.get("PRNN_STREAM_CHILD") == "1"  # set in the child processes
GPU_TESTS = torch.cuda.is_available() and os.environ.get("PRNN_STREAM_GPU_TESTS") == "1"
# Time limit of a test's own subprocess (the exit test): below the child's.
SUBPROCESS_TIMEOUT = float(os.environ.get("PRNN_STREAM_SUBPROCESS_TIMEOUT", "60"))
CUDA_TESTS = {}  # CUDA test function name -> its child process's time limit (s)


def cuda_test(limit):
    """Registers a CUDA test of the resident kernel: test_cuda_in_a_child runs
    it in a child process that may take `limit` seconds; it runs in-process
    only in such a child (PRNN_STREAM_CHILD=1). With a stream open such a test
    launches no CUDA kernel (see the note above cuda_module)."""
    def register(fn):
        CUDA_TESTS[fn.__name__] = limit
        return pytest.mark.skipif(not (CHILD and torch.cuda.is_available()),
                                  reason="a CUDA test of the resident kernel: runs in a child process of "
                                         "test_cuda_in_a_child (PRNN_STREAM_GPU_TESTS=1)")(fn)
    return register

STEP, SET_STATE, GET_STATE, RESET, STOP = 1, 2, 3, 4, 5
REQUEST, COMMAND, POSTED, X_TAG, READY, ANSWER = 0, 1, 2, 3, 32, 64  # int32 words of the mailbox (prnn.h)
MAILBOX_WORDS = ANSWER + 256  # PRNN_RESIDENT_MAX_CTAS answer words


def x_words_values(words, dtype, shape):
    """x_t from its tagged words (int64 [n]): the low halves' bytes as `dtype`, `shape`; and the tags."""
    halves = words.view(torch.int32)
    n = shape.numel() * torch.empty(0, dtype=dtype).element_size()
    payload = halves[0::2].contiguous().view(torch.uint8)[:n]
    return payload.view(dtype).reshape(shape), halves[1::2]


@pytest.fixture(autouse=True)
def _no_stream_left_open():
    """A stream left open would make any later device-wide synchronisation wait for it."""
    yield
    left = list(stream_module._open_streams)
    for s in left:
        s.close()
    assert not left, f"streams left open: {left}"


# ---- float64 cells -----------------------------------------------------------

def cell_step(cell, nonlinearity, layer_weights, x, h, c):
    """One step of one layer in float64 (PyTorch's definitions); returns (h, c)."""
    w_ih, w_hh, *b = [w.double() for w in layer_weights]
    b_ih, b_hh = b if b else (0.0, 0.0)
    gi, gh = x @ w_ih.t() + b_ih, h @ w_hh.t() + b_hh
    if cell == "rnn":
        return (torch.tanh if nonlinearity == "tanh" else torch.relu)(gi + gh), c
    if cell == "lstm":
        i, f, g, o = (gi + gh).chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c
    r_i, z_i, n_i = gi.chunk(3, 1)
    r_h, z_h, n_h = gh.chunk(3, 1)
    r, z = torch.sigmoid(r_i + r_h), torch.sigmoid(z_i + z_h)
    n = torch.tanh(n_i + r * n_h)
    return (1 - z) * n + z * h, c


def weights_by_layer(module):
    _, _, layers, _, _, bias, _, weights = stream_module._describe(module)
    per = 4 if bias else 2
    return [weights[i * per:(i + 1) * per] for i in range(layers)]


class FakeKernel(threading.Thread):
    """Plays the resident kernel for a ResidentStream built without pinned
    memory: answers its mailbox as `ctas` CTAs would (each its own answer
    word, in a shuffled order), computing in float64 and rounding h to the
    stream's dtype and an LSTM's c to float32 each step, as the kernel keeps
    them. A STEP's input words must all carry its sequence number.
    stall=True never answers (but still ends on a STOP it sees)."""

    def __init__(self, port, cell, nonlinearity, layer_weights, dtype, stall=False, ctas=3):
        super().__init__(daemon=True)
        mailbox, self.x_words, self.y, self.h_buf, self.c_buf, self.mask = port.buffers()
        self.mailbox = mailbox.numpy().view(np.uint32)
        self.request = mailbox.view(torch.int64).numpy()  # number and command: one 8-byte word, read at once
        assert self.mailbox.shape == (MAILBOX_WORDS,)
        self.cell, self.nonlinearity, self.layers, self.dtype = cell, nonlinearity, layer_weights, dtype
        self.stall, self.stopped, self.commands, self.errors = stall, False, [], []
        self.ctas = ctas
        port.expect_answers(ctas)
        L, B, H = self.h_buf.shape
        self.x_shape = torch.Size([B, layer_weights[0][0].shape[1]])
        self.h = torch.zeros(L, B, H, dtype=torch.float64)
        self.c = torch.zeros(L, B, H, dtype=torch.float64)

    def answer(self, seq):
        for cta in torch.randperm(self.ctas).tolist():
            self.mailbox[ANSWER + cta] = seq

    def run(self):
        self.mailbox[READY] = 1
        seen = 0
        while True:
            request = int(self.request[0])
            seq, command = request & 0xFFFFFFFF, request >> 32
            if seq == seen:
                time.sleep(20e-6)
                continue
            seen = seq
            self.commands.append(command)
            if command == STOP:
                self.stopped = True
                self.answer(seq)
                return
            if self.stall:
                continue
            self.execute(command, seq)
            self.answer(seq)

    def execute(self, command, seq):
        if command == STEP:
            x, tags = x_words_values(self.x_words, self.dtype, self.x_shape)
            tags = tags.to(torch.int64) & 0xFFFFFFFF
            if not bool((tags == seq).all()):  # the host posts a STEP after its words
                self.errors.append(f"STEP {seq}: input words tagged {sorted(set(tags.tolist()))}")
            inp = x.double()
            for layer, weights in enumerate(self.layers):
                h, c = cell_step(self.cell, self.nonlinearity, weights, inp, self.h[layer], self.c[layer])
                self.h[layer], self.c[layer] = h.to(self.dtype).double(), c.float().double()
                inp = self.h[layer]
            self.y.copy_(inp.to(self.dtype))
        elif command == GET_STATE:
            self.h_buf.copy_(self.h)
            if self.cell == "lstm":
                self.c_buf.copy_(self.c)
        elif command == SET_STATE:
            self.h.copy_(self.h_buf)
            if self.cell == "lstm":
                self.c.copy_(self.c_buf)
        elif command == RESET:
            rows = self.mask.bool()
            self.h[:, rows] = 0
            self.c[:, rows] = 0


@pytest.fixture
def fake_kernels(monkeypatch):
    """Streams open on the CPU, answered by FakeKernel threads (the list they
    append to); stall_next[0] = True makes the next one stall."""
    kernels, stall_next = [], [False]

    def launch(self, weights, bias, device, max_sms, start_timeout):
        per = 4 if bias else 2
        weights = [w.clone() for w in weights]  # the kernel copies them when it starts
        layer_weights = [weights[i * per:(i + 1) * per] for i in range(len(weights) // per)]
        kernel = FakeKernel(self._port, self._cell.split("_")[0], self._cell.split("_")[-1], layer_weights,
                            self._dtype, stall=stall_next[0])
        kernel.start()
        while not kernel.mailbox[READY]:
            time.sleep(1e-4)
        kernels.append(kernel)
        return [1, 256, self._hidden_size, 0]

    monkeypatch.setattr(torch_prnn.Stream, "_device_for", staticmethod(lambda weight_device, device: torch.device("cpu")))
    monkeypatch.setattr(torch_prnn.Stream, "_launch", launch)
    yield kernels, stall_next
    errors = [error for kernel in kernels for error in kernel.errors]
    assert not errors, errors


def make_module(cell, input_size, hidden_size, num_layers=1, bias=True, dtype=torch.float32, device="cpu",
                nonlinearity="tanh"):
    if cell == "rnn":
        return torch_prnn.PersistentRNN(input_size, hidden_size, num_layers, nonlinearity=nonlinearity, bias=bias,
                                        device=device, dtype=dtype)
    cls = torch.nn.LSTM if cell == "lstm" else torch.nn.GRU
    return cls(input_size, hidden_size, num_layers, bias=bias, device=device, dtype=dtype)


def reference(module, x, state=None):
    """The module's whole-sequence function in float64 on the CPU: y [T, B, H] and the final state."""
    cell = stream_module._describe(module)[0]
    nonlinearity = getattr(module, "nonlinearity", "tanh")
    layers = weights_by_layer(module)
    T, B, _ = x.shape
    H = module.hidden_size
    if state is None:
        h = torch.zeros(len(layers), B, H, dtype=torch.float64)
        c = torch.zeros_like(h)
    else:
        h, c = (state if isinstance(state, tuple) else (state, torch.zeros_like(state)))
        h, c = h.double().cpu().clone(), c.double().cpu().clone()
    ys = []
    for t in range(T):
        inp = x[t].double().cpu()
        for layer, weights in enumerate(layers):
            h[layer], c[layer] = cell_step(cell, nonlinearity, [w.cpu() for w in weights], inp, h[layer], c[layer])
            inp = h[layer]
        ys.append(inp.clone())
    return torch.stack(ys), ((h, c) if cell == "lstm" else h)


# ---- CPU: what cannot stream, and bad arguments ------------------------------

def test_refuses_what_cannot_stream():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        torch_prnn.Stream("rnn")
    with pytest.raises(TypeError, match="recurrent module"):
        torch_prnn.Stream(torch.nn.Linear(3, 4))
    with pytest.raises(ValueError, match="bidirectional"):
        torch_prnn.Stream(torch_prnn.PersistentRNN(3, 4, bidirectional=True, device="cpu"), device="cuda")
    with pytest.raises(NotImplementedError, match="proj_size"):
        torch_prnn.Stream(torch.nn.LSTM(3, 4, proj_size=2), device="cuda")
    with pytest.raises(NotImplementedError, match="float64"):
        torch_prnn.Stream(torch_prnn.PersistentRNN(3, 4, dtype=torch.float64), device="cuda")
    with pytest.raises(NotImplementedError, match="at most 8 layers"):
        torch_prnn.Stream(torch_prnn.PersistentRNN(3, 4, num_layers=9), device="cuda")


def test_cpu_module_needs_a_cuda_device():
    module = torch_prnn.PersistentRNN(3, 4)
    with pytest.raises(ValueError, match=r"module is on cpu; a stream runs on a CUDA GPU.*device='cuda'"):
        torch_prnn.Stream(module)
    with pytest.raises(ValueError, match="device must be a CUDA device, got cpu"):
        torch_prnn.Stream(module, device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            torch_prnn.Stream(module, device="cuda")


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch=0), "batch must be an integer >= 1"),
    (dict(batch=True), "batch must be an integer >= 1"),
    (dict(batch=1.5), "batch must be an integer >= 1"),
    (dict(timeout=0), "timeout must be a number of seconds > 0"),
    (dict(timeout="1"), "timeout must be a number of seconds > 0"),
    (dict(start_timeout=-1.0), "start_timeout must be a number of seconds > 0"),
    (dict(max_sms=0), "max_sms must be None or an integer >= 1"),
])
def test_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        torch_prnn.Stream(torch_prnn.PersistentRNN(3, 4), device="cuda", **kwargs)


def port(cell="rnn", nonlinearity="tanh", layers=1, batch=2, input_size=3, hidden=4, dtype=torch.float32,
         timeout=0.05):
    return torch.classes.prnn.ResidentStream(cell, nonlinearity, layers, batch, input_size, hidden, dtype, False,
                                             timeout)


@pytest.mark.parametrize("args, error, message", [
    (dict(cell="elman"), ValueError, "cell must be 'rnn', 'lstm' or 'gru'"),
    (dict(nonlinearity="sigmoid"), ValueError, "nonlinearity must be 'tanh' or 'relu'"),
    (dict(layers=0), ValueError, r"num_layers must be in \[1, 8\]"),
    (dict(layers=9), ValueError, r"num_layers must be in \[1, 8\]"),
    (dict(batch=0), ValueError, "batch, input_size and hidden_size must be >= 1"),
    (dict(dtype=torch.float64), NotImplementedError, "float32, bfloat16 or float16"),
    (dict(timeout=0.0), ValueError, "timeout must be > 0"),
])
def test_host_side_refuses_bad_shapes(args, error, message):
    with pytest.raises(error, match=message):
        port(**args)


def test_host_side_buffers():
    p = port(cell="lstm", layers=2, batch=3, input_size=5, hidden=4, dtype=torch.bfloat16)
    mailbox, x, y, h, c, mask = p.buffers()
    assert mailbox.shape == (MAILBOX_WORDS,) and mailbox.dtype == torch.int32 and not mailbox.any()
    assert x.shape == (8,) and x.dtype == torch.int64  # 30 bytes of x_t: 8 tagged words of 4 bytes
    assert y.shape == (3, 4) and y.dtype == torch.bfloat16
    assert h.shape == c.shape == (2, 3, 4) and h.dtype == c.dtype == torch.float32
    assert mask.shape == (3,) and mask.dtype == torch.uint8
    assert mailbox.data_ptr() % 128 == 0 and x.data_ptr() % 128 == 0
    assert port().buffers()[4].numel() == 0  # c only for an LSTM
    assert p.is_open() and p.ctas() == 0
    p.close()
    assert not p.is_open()
    p.close()  # idempotent


def _span(p):
    """(first byte, end) of a port's buffers."""
    pieces = [b for b in p.buffers() if b.numel()]
    return min(b.data_ptr() for b in pieces), max(b.data_ptr() + b.numel() * b.element_size() for b in pieces)


def test_host_side_buffers_come_from_a_pool():
    """Streams' buffers are pieces of a few big allocations (a pinned one
    each would be a cudaHostAlloc beside the open streams' kernels): open at
    once they do not overlap, a closed one's piece comes back zeroed."""
    ports = [port(cell="lstm", layers=3, batch=4, hidden=h) for h in (4, 300, 4, 1000)]
    spans = sorted(_span(p) for p in ports)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans
    for p in ports:
        for b in p.buffers():
            b.fill_(7)  # garbage for whoever gets the piece next
    for p in ports[::2]:
        p.close()
    again = [port(cell="lstm", layers=3, batch=4, hidden=4) for _ in range(2)]
    for p in again:
        assert all(not b.any() for b in p.buffers())  # zeroed
    spans = sorted(_span(p) for p in again + ports[1::2])
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans
    for p in again + ports[1::2]:
        p.close()
    starts = set()
    for _ in range(20):  # one shape opened and closed in turn reuses its piece
        p = port(hidden=64)
        starts.add(_span(p)[0])
        p.close()
    assert len(starts) == 1, starts


def test_host_side_without_an_answer_times_out_and_breaks():
    p = port(timeout=0.05)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"Stream.step: no answer within 0.05 s \(the stream's timeout\)"):
        p.step(torch.zeros(2, 3))
    assert 0.05 <= time.monotonic() - start < 5
    with pytest.raises(RuntimeError, match=r"the stream is broken \(no answer within.*close\(\) it"):
        p.step(torch.zeros(2, 3))
    with pytest.raises(RuntimeError, match="broken"):
        p.get_state()
    p.close()  # nobody reported ready, nothing to stop
    with pytest.raises(RuntimeError, match="Stream.step: the stream is closed"):
        p.step(torch.zeros(2, 3))
    with pytest.raises(RuntimeError, match="closed"):
        p.buffers()


def answer_in_a_thread(p, answers):
    """A thread that answers the next command posted to port p as `answers`
    (cta -> the number it writes, given the command's; None: the command's
    own) once it sees it; returns the thread (started)."""
    mailbox = p.buffers()[0].numpy().view(np.uint32)
    request = p.buffers()[0].view(torch.int64).numpy()
    before = int(request[0])

    def run():
        deadline = time.monotonic() + 10
        while int(request[0]) == before and time.monotonic() < deadline:
            time.sleep(1e-5)
        seq = int(request[0]) & 0xFFFFFFFF
        for cta, number in answers.items():
            mailbox[ANSWER + cta] = seq if number is None else number(seq)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_host_side_waits_for_every_cta():
    """A command is done when every CTA's answer word holds its number: not
    before the last, and never on a stale number."""
    p = port(timeout=0.1)
    p.expect_answers(4)
    thread = answer_in_a_thread(p, {3: None, 0: None, 2: None})  # CTA 1 never answers
    with pytest.raises(RuntimeError, match="no answer within 0.1 s"):
        p.step(torch.zeros(2, 3))
    thread.join()
    p.close()
    p = port(timeout=0.1)
    p.expect_answers(2)
    thread = answer_in_a_thread(p, {0: None, 1: lambda seq: seq - 1})  # CTA 1 answers the command before
    with pytest.raises(RuntimeError, match="no answer within 0.1 s"):
        p.get_state()
    thread.join()
    p.close()
    p = port(timeout=5.0)
    p.expect_answers(4)
    thread = answer_in_a_thread(p, {c: None for c in (2, 0, 3, 1)})
    assert p.step(torch.zeros(2, 3)).shape == (2, 4)
    thread.join()
    with pytest.raises(ValueError, match=r"ctas must be in \[1, 256\]"):
        p.expect_answers(257)
    p.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_host_side_tags_the_input_words(dtype):
    """A STEP's x_t goes into words of 4 bytes each tagged with the STEP's
    number (the kernel trusts a word by its tag), posted after them."""
    p = port(batch=3, input_size=5, dtype=dtype, timeout=5.0)
    mailbox, words = p.buffers()[:2]
    request = mailbox.view(torch.int64)
    for t in range(3):
        x = torch.randn(3, 5).to(dtype)
        thread = answer_in_a_thread(p, {0: None})
        p.step(x)
        thread.join()
        seq = int(request[0]) & 0xFFFFFFFF
        values, tags = x_words_values(words, dtype, x.shape)
        assert int(request[0]) >> 32 == STEP and seq == t + 1
        assert torch.equal(values, x) and bool((tags == seq).all())
        assert int(mailbox[X_TAG]) == seq
    p.close()


def test_sequence_numbers_wrap(fake_kernels):
    """Through the 32-bit wrap of the numbers the streamed steps still equal the sequence."""
    module = make_module("gru", 5, 6)
    x = torch.randn(8, 2, 5)
    y_ref, state_ref = reference(module, x)
    with torch_prnn.Stream(module, batch=2) as stream:
        mailbox = stream._port.buffers()[0].numpy().view(np.uint32)
        mailbox[POSTED] = 0xFFFFFFFF - 3  # the fake saw none of these numbers
        ys = torch.stack([stream.step(x[t]) for t in range(8)])
        assert int(mailbox[POSTED]) < 8  # wrapped
        state = stream.state
    assert rel_err(ys, y_ref) < 1e-6 and rel_err(state, state_ref) < 1e-6


def test_step_takes_values_not_bytes(fake_kernels):
    """What declines the hot path is stepped by its values: a negative view
    (whose bytes are not its values), a Parameter, a non-contiguous x."""
    module = make_module("rnn", 5, 6)
    x = torch.randn(3, 1, 5)
    y_ref, _ = reference(module, x)
    with torch_prnn.Stream(module) as stream:
        y0 = stream.step(torch._neg_view(-x[0]))
        y1 = stream.step(torch.nn.Parameter(x[1].clone(), requires_grad=False))
        out = torch.empty(1, 6)
        strided = torch.stack([x[2], x[2]], -1)[..., 0]  # [1, 5], stride 2
        assert stream.step(strided, out=torch._neg_view(out)) is not None
    assert rel_err(y0, y_ref[0]) < 1e-6 and rel_err(y1, y_ref[1]) < 1e-6
    assert rel_err(-out, y_ref[2]) < 1e-6


def test_host_side_launch_needs_pinned_buffers():
    p = port()
    match = "not pinned" if torch.version.cuda else "built without CUDA"
    with pytest.raises(RuntimeError, match=match):
        p.launch([torch.zeros(4, 3), torch.zeros(4, 4)], False, 0, 0, 1.0)
    p.close()


# ---- CPU: the Python object against a fake kernel ---------------------------

CELLS = [("rnn", "tanh"), ("rnn", "relu"), ("lstm", "tanh"), ("gru", "tanh")]


@pytest.mark.parametrize("cell, nonlinearity", CELLS)
@pytest.mark.parametrize("num_layers, bias", [(1, True), (2, False)])
def test_steps_equal_the_sequence(fake_kernels, cell, nonlinearity, num_layers, bias):
    module = make_module(cell, 5, 6, num_layers, bias, nonlinearity=nonlinearity)
    x = torch.randn(12, 3, 5)
    y_ref, state_ref = reference(module, x)
    with torch_prnn.Stream(module, batch=3) as stream:
        assert stream.cell == (f"rnn_{nonlinearity}" if cell == "rnn" else cell)
        assert (stream.batch, stream.input_size, stream.hidden_size, stream.num_layers) == (3, 5, 6, num_layers)
        ys = torch.stack([stream.step(x[t]) for t in range(12)])
        assert rel_err(ys, y_ref) < 1e-6
        state = stream.state
        if cell == "lstm":
            assert rel_err(state[0], state_ref[0]) < 1e-6 and rel_err(state[1], state_ref[1]) < 1e-6
        else:
            assert rel_err(state, state_ref) < 1e-6
    # The module's own forward agrees (float32 on the CPU).
    with torch.no_grad():
        y_module, _ = module(x)
    assert rel_err(ys, y_module) < 1e-5


def test_step_forms(fake_kernels):
    module = make_module("rnn", 5, 6)
    x = torch.randn(4, 1, 5)
    y_ref, _ = reference(module, x)
    with torch_prnn.Stream(module, batch=1) as stream:
        out = torch.empty(1, 6)
        assert stream.step(x[0], out=out) is out  # the fast path into out
        assert rel_err(out, y_ref[0]) < 1e-6
        y1 = stream.step(x[1, 0])  # unbatched
        assert y1.shape == (6,) and rel_err(y1, y_ref[1, 0]) < 1e-6
        wide = torch.randn(1, 10)
        wide[:, ::2] = x[2]
        y2 = stream.step(wide[:, ::2])  # not contiguous: the general path
        assert rel_err(y2, y_ref[2]) < 1e-6
        out_t = torch.empty(6, 1).t()  # out not contiguous
        assert stream.step(x[3], out=out_t) is out_t and rel_err(out_t, y_ref[3]) < 1e-6


def test_an_elman_module_streams_by_its_mode(fake_kernels):
    """nn.RNN computes by mode, not nonlinearity (which only sets mode at
    construction): a stream of a module whose mode was changed steps as the
    module's forward does."""
    module = make_module("rnn", 5, 6)
    module.mode = "RNN_RELU"
    x = torch.randn(3, 1, 5)
    with torch_prnn.Stream(module) as stream:
        assert stream.cell == "rnn_relu"
        ys = torch.stack([stream.step(x[t]) for t in range(3)])
    with torch.no_grad():
        assert rel_err(ys, module(x)[0]) < 1e-6


def test_bad_step_arguments(fake_kernels):
    with torch_prnn.Stream(make_module("rnn", 5, 6), batch=2) as stream:
        with pytest.raises(TypeError, match="x must be a tensor, got list"):
            stream.step([1.0] * 5)
        with pytest.raises(ValueError, match=r"x must have shape \[batch=2, input_size=5\], got \[2, 4\]"):
            stream.step(torch.zeros(2, 4))
        with pytest.raises(ValueError, match=r"x must have shape \[batch=2, input_size=5\], got \[5\]"):
            stream.step(torch.zeros(5))  # unbatched only for a batch of one
        with pytest.raises(ValueError, match="x must have the stream's dtype Float, got Double"):
            stream.step(torch.zeros(2, 5, dtype=torch.float64))
        with pytest.raises(ValueError, match="x must be on the CPU, got meta"):
            stream.step(torch.zeros(2, 5, device="meta"))
        with pytest.raises(ValueError, match=r"out must have shape \[batch=2, hidden_size=6\], got \[2, 5\]"):
            stream.step(torch.zeros(2, 5), out=torch.zeros(2, 5))
        with pytest.raises(ValueError, match="out must have the stream's dtype Float, got BFloat16"):
            stream.step(torch.zeros(2, 5), out=torch.zeros(2, 6, dtype=torch.bfloat16))
        with pytest.raises(TypeError, match="out must be a tensor or None"):
            stream.step(torch.zeros(2, 5), out=[0.0])
        assert stream.step(torch.zeros(2, 5)).shape == (2, 6)  # still usable after refused arguments


def test_out_refused_before_the_step_runs(fake_kernels):
    """An out= that cannot be written is refused before the step is posted:
    the state does not move on and no y_t is lost."""
    kernels, _ = fake_kernels
    module = make_module("rnn", 5, 6)
    x = torch.randn(3, 2, 5)
    with torch_prnn.Stream(module, batch=2) as stream:
        stream.step(x[0])
        steps = kernels[-1].commands.count(STEP)
        leaf = torch.zeros(6, 2, requires_grad=True)
        with torch.inference_mode():
            inference = torch.zeros(2, 6)
        for out, error, message in (
            (torch.zeros(1, 6).expand(2, 6), ValueError, "out must not have elements that share memory"),
            (leaf.t(), ValueError, "out must not require grad"),
            (torch.zeros(2, 6, requires_grad=True), ValueError, "out must not require grad"),
            (inference, RuntimeError, "[Ii]nference"),
            (torch.zeros(2, 6).to_sparse(), ValueError, "out must be a dense"),
        ):
            with pytest.raises(error, match=message):
                stream.step(x[1], out=out)
        with pytest.raises(ValueError, match="x must be a dense"):
            stream.step(x[1].to_sparse())
        assert kernels[-1].commands.count(STEP) == steps  # nothing was posted
        with torch.inference_mode():
            assert stream.step(x[1], out=inference) is inference  # inside inference mode it may be written
        y = stream.step(x[2])
    y_ref, _ = reference(module, x)
    assert rel_err(inference, y_ref[1]) < 1e-6 and rel_err(y, y_ref[2]) < 1e-6


def test_out_version_moves_on(fake_kernels):
    """step(out=) is an in-place write: out's version counter moves on, so
    that autograd sees a saved tensor overwritten."""
    with torch_prnn.Stream(make_module("rnn", 5, 6), batch=1) as stream:
        for out in (torch.zeros(1, 6), torch.zeros(6, 1).t()):  # the fast path and the checked one
            before = out._version
            stream.step(torch.zeros(1, 5), out=out)
            assert out._version > before


def test_state_and_reset(fake_kernels):
    for cell in ("rnn", "lstm"):
        module = make_module(cell, 5, 6, 2)
        x = torch.randn(6, 3, 5)
        with torch_prnn.Stream(module, batch=3) as stream:
            zero = stream.state
            zero_h = zero[0] if cell == "lstm" else zero
            assert zero_h.shape == (2, 3, 6) and not zero_h.any()
            for t in range(3):
                stream.step(x[t])
            saved = stream.state
            # set_state: continuing from a saved state equals continuing the sequence
            ys = torch.stack([stream.step(x[t]) for t in range(3, 6)])
            stream.set_state(saved)
            again = torch.stack([stream.step(x[t]) for t in range(3, 6)])
            assert torch.equal(ys, again)
            _, state_ref = reference(module, x[:3])
            y_ref, _ = reference(module, x[3:], state_ref)
            assert rel_err(again, y_ref) < 1e-6
            # reset(mask): the masked sequences start afresh, the others go on
            stream.set_state(saved)
            stream.reset(torch.tensor([True, False, True]))
            y_reset = stream.step(x[3])
            fresh, _ = reference(module, x[3:4])
            assert rel_err(y_reset[[0, 2]], fresh[0, [0, 2]]) < 1e-6
            assert rel_err(y_reset[1], y_ref[0, 1]) < 1e-6
            stream.reset([False, True, False])  # a sequence of bools
            stream.reset()  # every sequence
            h = stream.state[0] if cell == "lstm" else stream.state
            assert not h.any()


def test_bad_state_arguments(fake_kernels):
    with torch_prnn.Stream(make_module("rnn", 5, 6), batch=2) as stream:
        with pytest.raises(ValueError, match=r"h must have shape \[num_layers=1, batch=2, hidden_size=6\]"):
            stream.set_state(torch.zeros(2, 6))
        with pytest.raises(TypeError, match=r"the state of a rnn_tanh stream is a tensor h \[num_layers, batch, "
                                            r"hidden_size\], got list"):
            stream.set_state([[0.0]])
        with pytest.raises(ValueError, match="h must be a floating-point tensor"):
            stream.set_state(torch.zeros(1, 2, 6, dtype=torch.int64))
        with pytest.raises(ValueError, match="h must be on the CPU"):
            stream.set_state(torch.zeros(1, 2, 6, device="meta"))
        with pytest.raises(ValueError, match=r"mask must be a bool tensor of shape \[batch=2\], got Long"):
            stream.reset(torch.tensor([1, 0]))
        with pytest.raises(ValueError, match=r"mask must be a bool tensor of shape \[batch=2\], got Bool \[3\]"):
            stream.reset([True, False, True])
    with torch_prnn.Stream(make_module("lstm", 5, 6), batch=2) as stream:
        with pytest.raises(TypeError, match=r"an LSTM's state is a pair \(h, c\), got Tensor"):
            stream.set_state(torch.zeros(1, 2, 6))
        with pytest.raises(TypeError, match=r"an LSTM's state is a pair \(h, c\), got a list of 3"):
            stream.set_state([torch.zeros(1, 2, 6)] * 3)
        with pytest.raises(TypeError, match="c must be a tensor, got float"):
            stream.set_state((torch.zeros(1, 2, 6), 0.0))


def test_closed_stream_refuses_everything(fake_kernels):
    kernels, _ = fake_kernels
    stream = torch_prnn.Stream(make_module("rnn", 5, 6), batch=1)
    assert not stream.closed
    stream.close()
    assert stream.closed and kernels[-1].stopped and stream.sms == 0
    stream.close()  # idempotent
    for call in (lambda: stream.step(torch.zeros(1, 5)), lambda: stream.step(torch.zeros(5), out=torch.zeros(6)),
                 lambda: stream.state, lambda: stream.set_state(torch.zeros(1, 1, 6)), lambda: stream.reset()):
        with pytest.raises(RuntimeError, match="the stream is closed"):
            call()
    assert "closed" in repr(stream)


def test_closing_paths_stop_the_kernel(fake_kernels):
    kernels, _ = fake_kernels
    module = make_module("gru", 5, 6)
    with torch_prnn.Stream(module) as stream:
        stream.step(torch.zeros(1, 5))
    assert stream.closed and kernels[-1].stopped
    stream = torch_prnn.Stream(module)
    kernel = kernels[-1]
    del stream
    gc.collect()
    assert kernel.stopped  # collected -> closed
    with pytest.raises(ZeroDivisionError):
        with torch_prnn.Stream(module) as stream:
            1 / 0
    assert stream.closed and kernels[-1].stopped


def check_open_close_cycles(module, x, cycles):
    """Every stream of `cycles` opened and closed in turn starts from a zero state."""
    first = None
    for _ in range(cycles):
        with torch_prnn.Stream(module) as stream:
            y = stream.step(x)
        first = y if first is None else first
        assert torch.equal(y, first)


def test_many_open_close_cycles(fake_kernels):
    check_open_close_cycles(make_module("rnn", 5, 6), torch.randn(1, 5), 50)
    assert all(k.stopped for k in fake_kernels[0])


def test_timeout_raises_then_the_stream_is_broken(fake_kernels):
    kernels, stall_next = fake_kernels
    stall_next[0] = True
    stream = torch_prnn.Stream(make_module("rnn", 5, 6), timeout=0.1)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"Stream.step: no answer within 0.1 s"):
        stream.step(torch.zeros(1, 5))
    assert 0.1 <= time.monotonic() - start < 5
    with pytest.raises(RuntimeError, match="the stream is broken"):
        stream.step(torch.zeros(1, 5))
    with pytest.raises(RuntimeError, match="the stream is broken"):
        stream.state
    stream.close()  # the fake still ends on the STOP it sees
    assert stream.closed and kernels[-1].stopped


def test_timeout_of_state_commands(fake_kernels):
    _, stall_next = fake_kernels
    stall_next[0] = True
    stream = torch_prnn.Stream(make_module("rnn", 5, 6), timeout=0.05)
    with pytest.raises(TimeoutError, match=r"Stream.state: no answer within 0.05 s"):
        stream.state
    stream.close()


def check_refresh(module, x):
    """Weights changed after opening are not seen until refresh(), which keeps the state."""
    before = copy.deepcopy(module).cpu()
    changed = -0.5 * module.weight_hh_l0.detach().cpu()  # computed before the stream opens
    with torch_prnn.Stream(module) as stream:
        stream.step(x[0])
        with torch.no_grad():
            module.weight_hh_l0.copy_(changed)  # on CUDA a copy from the host: no kernel beside the stream
        y_stale = stream.step(x[1])  # the weights copied at open
        stream.refresh()
        y_fresh = stream.step(x[2])
    y_before, state = reference(before, x[:2])
    y_after, _ = reference(module, x[2:3], state)
    assert rel_err(y_stale, y_before[1]) < 1e-5
    assert rel_err(y_fresh, y_after[0]) < 1e-5


def test_refresh_reads_changed_weights_and_keeps_the_state(fake_kernels):
    check_refresh(make_module("lstm", 5, 6), torch.randn(3, 1, 5))


def test_refresh_refuses_a_changed_module_and_a_failed_one_leaves_it_closed(fake_kernels, monkeypatch):
    kernels, _ = fake_kernels
    module = make_module("rnn", 5, 6)
    stream = torch_prnn.Stream(module)
    y0 = stream.step(torch.ones(1, 5))
    module.double()  # a module the stream cannot take: refused before anything closes
    with pytest.raises(NotImplementedError, match="not torch.float64"):
        stream.refresh()
    module.float()
    other = make_module("rnn", 5, 7)
    stream._module = other
    with pytest.raises(ValueError, match=r"Stream.refresh: the module changed from .*6.* to .*7"):
        stream.refresh()
    stream._module = module
    assert not stream.closed and stream.step(torch.ones(1, 5)).shape == (1, 6)  # still the same stream

    def failing_launch(self, *args):
        raise RuntimeError("Stream: the resident kernel did not start: a test's failure")

    monkeypatch.setattr(torch_prnn.Stream, "_launch", failing_launch)
    with pytest.raises(RuntimeError, match="a test's failure"):
        stream.refresh()
    assert stream.closed and kernels[-1].stopped and "closed" in repr(stream)
    for _ in range(3):  # the old port's handle, on the fast path: a closed stream, not freed memory
        with pytest.raises(RuntimeError, match="the stream is closed"):
            stream.step(torch.ones(1, 5))
        with pytest.raises(RuntimeError, match="the stream is closed"):
            stream.step(torch.ones(1, 5), out=torch.empty(1, 6))
    with pytest.raises(RuntimeError, match="Stream.refresh: the stream is closed"):
        stream.refresh()
    with pytest.raises(RuntimeError, match="the stream is closed"):
        with stream:
            pass
    assert y0.shape == (1, 6)


def test_refresh_beside_steps_in_other_threads(fake_kernels):
    """Steps in other threads while the stream refreshes either step or find
    the stream closed for a moment; none crashes."""
    module = make_module("rnn", 5, 6)
    with torch_prnn.Stream(module, batch=1) as stream:
        done = threading.Event()
        outcomes = []

        def stepping():
            x, out = torch.zeros(1, 5), torch.empty(1, 6)
            while not done.is_set():
                try:
                    stream.step(x, out=out)
                    outcomes.append("stepped")
                except RuntimeError as error:
                    assert "the stream is closed" in str(error), error
                    outcomes.append("closed")

        threads = [threading.Thread(target=stepping, daemon=True) for _ in range(2)]
        for thread in threads:
            thread.start()
        for _ in range(10):
            stream.refresh()
        done.set()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads) and "stepped" in outcomes


def test_a_broken_stream_is_not_closed_until_closed(fake_kernels):
    kernels, stall_next = fake_kernels
    stall_next[0] = True
    stream = torch_prnn.Stream(make_module("rnn", 5, 6), timeout=0.05)
    with pytest.raises(TimeoutError):
        stream.step(torch.zeros(1, 5))
    assert not stream.closed and "broken" in repr(stream)  # its kernel may still hold its SMs
    stream.close()
    assert stream.closed and stream.sms == 0 and kernels[-1].stopped


def test_a_stream_cannot_be_copied(fake_kernels):
    with torch_prnn.Stream(make_module("rnn", 5, 6)) as stream:
        for copier in (copy.copy, copy.deepcopy):
            with pytest.raises(TypeError, match="a stream cannot be copied"):
                copier(stream)
        assert stream.step(torch.zeros(1, 5)).shape == (1, 6)


def test_threads_share_a_stream(fake_kernels):
    module = make_module("rnn", 5, 6)
    with torch_prnn.Stream(module, batch=2) as stream:
        conftest.run_threads(lambda: [stream.step(torch.zeros(2, 5)) for _ in range(20)], [()] * 4, timeout=60)
        assert len(fake_kernels[0][-1].commands) == 80


# ---- CUDA: the resident kernel -------------------------------------------------
# While a stream is open these tests launch no CUDA kernel and wait for no
# device-wide synchronisation: its kernel only ends when it closes, and under
# CUDA's lazy loading (the default) the first launch of a kernel not yet used
# in the process waits for the device to be idle - never, beside an open
# stream (a rel_err on the GPU, an allclose or a weight's mul_ inside a
# stream all hung that way). GPU tensors are compared after the stream closes
# or after a copy to the CPU (contiguous: a plain memcpy); what a test runs
# beside a stream on purpose is run once before it opens.

def cuda_module(cell, input_size, hidden_size, num_layers=1, bias=True, dtype=torch.float32, nonlinearity="tanh",
                seed=0):
    torch.manual_seed(seed)
    return make_module(cell, input_size, hidden_size, num_layers, bias, dtype, "cuda", nonlinearity).eval()


def stream_sequence(stream, x):
    """The stream's outputs for x [T, B, I] on the CPU, one step a call."""
    return torch.stack([stream.step(x[t]) for t in range(x.shape[0])])


@cuda_test(300)
@pytest.mark.hang_guard(60)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B", [1, 3, 8])
@pytest.mark.parametrize("I, H", [(5, 7), (64, 256), (1024, 1024)])
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_cuda_elman_steps_equal_the_sequence(dtype, B, I, H, nonlinearity):
    module = cuda_module("rnn", I, H, dtype=dtype, nonlinearity=nonlinearity)
    x = (0.5 * torch.randn(32, B, I)).to(dtype)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    with torch_prnn.Stream(module, batch=B) as stream:
        held = stream.sms
        ys = stream_sequence(stream, x)
        h = stream.state
    assert 1 <= held <= sms
    with torch.no_grad():
        y_seq, h_seq = module(x.cuda())
    y_ref, h_ref = reference(module, x)
    # Within the dtype's rounding of a float64 reference, as the whole-sequence forward is; and next to it
    # (not bit for bit: the stream projects the input in its kernel, the forward in a GEMM).
    assert rel_err(ys, y_ref) < TOL[dtype], rel_err(y_seq, y_ref)
    assert rel_err(ys, y_seq.cpu()) < 2 * TOL[dtype]
    assert rel_err(h, h_ref) < TOL[dtype] and h.device == h_seq.device and h.dtype == dtype


@cuda_test(240)
@pytest.mark.hang_guard(60)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B, I, H", [(1, 5, 7), (3, 64, 256), (8, 256, 256), (1, 1024, 1024)])
def test_cuda_gated_steps_equal_the_sequence(cell, dtype, B, I, H):
    module = cuda_module(cell, I, H, dtype=dtype)
    x = (0.5 * torch.randn(32, B, I)).to(dtype)
    y_ref, state_ref = reference(module, x)
    try:
        stream = torch_prnn.Stream(module, batch=B)
    except NotImplementedError as error:  # an LSTM of H = 1024 in float32 is 32 MiB: more than the SMs hold
        assert (cell, dtype, H) == ("lstm", torch.float32, 1024), error
        assert "fit in shared memory" in str(error)
        return
    with stream:
        ys = stream_sequence(stream, x)
        state = stream.state
    assert rel_err(ys, y_ref) < TOL[dtype]
    if cell == "lstm":
        assert rel_err(state[0], state_ref[0]) < TOL[dtype] and rel_err(state[1], state_ref[1]) < TOL[dtype]
    else:
        assert rel_err(state, state_ref) < TOL[dtype]


@cuda_test(120)
@pytest.mark.hang_guard(60)
@pytest.mark.parametrize("cell", ["rnn", "gru"])
@pytest.mark.parametrize("B, I", [(1, 1024), (3, 5), (8, 1024)])  # x_t read with the request (8 KiB, 60 B) or not
def test_cuda_paced_steps_equal_steps_in_a_loop(cell, B, I):
    """Steps taken in a loop (the kernel reads x_t with its polls of the
    request) and steps more than the eager window apart (x_t read after the
    request) give the same outputs, bit for bit, and the sequence's."""
    module = cuda_module(cell, I, 256)
    x = (0.5 * torch.randn(12, B, I))
    y_ref, _ = reference(module, x)
    with torch_prnn.Stream(module, batch=B) as stream:
        looped = stream_sequence(stream, x)
        stream.reset()
        paced = []
        for t in range(12):
            if t % 2:
                time.sleep(0.002)  # past the kernel's 100 us window
            paced.append(stream.step(x[t]))
        paced = torch.stack(paced)
    assert torch.equal(looped, paced)
    assert rel_err(looped, y_ref) < 1e-5


@cuda_test(120)
@pytest.mark.hang_guard(60)
@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cuda_layers_and_no_bias(cell, dtype):
    module = cuda_module(cell, 48, 256, num_layers=3, bias=False, dtype=dtype)
    x = (0.5 * torch.randn(16, 4, 48)).to(dtype)
    y_ref, _ = reference(module, x)
    with torch_prnn.Stream(module, batch=4) as stream:
        ys = stream_sequence(stream, x)
    assert rel_err(ys, y_ref) < TOL[dtype]


@cuda_test(120)
@pytest.mark.hang_guard(60)
@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
def test_cuda_state_and_reset(cell):
    module = cuda_module(cell, 32, 256, num_layers=2)
    x = torch.randn(8, 3, 32)
    _, state_ref = reference(module, x[:4])
    fresh, _ = reference(module, x[4:5])
    going, _ = reference(module, x[4:5], state_ref)
    mask = torch.tensor([False, True, False]).cuda()  # a copy to the GPU, no kernel
    out_t = torch.empty(256, 3, device="cuda").t()  # [3, 256], dense, not contiguous
    with torch_prnn.Stream(module, batch=3) as stream:
        stream_sequence(stream, x[:4])
        saved = stream.state
        saved_cpu = tuple(t.cpu() for t in saved) if cell == "lstm" else saved.cpu()  # contiguous: a memcpy
        ys = stream_sequence(stream, x[4:])
        stream.set_state(saved)  # from the GPU
        again = stream_sequence(stream, x[4:])
        stream.set_state(saved_cpu)  # from the CPU
        stream.reset(mask)  # on the GPU
        y = stream.step(x[4])
        stream.set_state(saved_cpu)
        y_going = stream.step(x[4])
        stream.set_state(saved_cpu)
        assert stream.step(x[4].cuda(), out=out_t) is out_t  # on the GPU, into a strided out
    out_cpu = out_t.cpu()  # after the stream closed: a strided copy from the GPU is a kernel
    pairs = zip(saved, state_ref) if cell == "lstm" else [(saved, state_ref)]
    for got, want in pairs:
        assert got.device.type == "cuda" and rel_err(got, want) < 1e-5
    assert torch.equal(again, ys)  # the same steps from the same state, bit for bit
    assert rel_err(y[1], fresh[0, 1]) < 1e-5
    assert rel_err(y[[0, 2]], going[0, [0, 2]]) < 1e-5
    assert rel_err(y_going, going[0]) < 1e-5 and torch.equal(out_cpu, y_going)


@cuda_test(120)
@pytest.mark.hang_guard(60)
def test_cuda_step_devices_and_out():
    module = cuda_module("rnn", 16, 128)
    x = torch.randn(3, 1, 16)
    y_ref, _ = reference(module, x)
    x_gpu = x.cuda()  # copies to the GPU before the stream opens; no kernel
    x_strided = torch.stack([x[2], torch.zeros_like(x[2])], dim=-1).cuda()[..., 0]  # [1, 16], stride 2
    out = torch.empty(128, device="cuda")
    not_dense = torch.empty(1, 128, 2, device="cuda")[..., 0]  # [1, 128] with holes
    with torch_prnn.Stream(module) as stream:
        y0 = stream.step(x_gpu[0])  # on the GPU in, on the GPU out
        assert stream.step(x_gpu[1, 0], out=out) is out
        y2 = stream.step(x_strided)  # on the GPU, not contiguous
        with pytest.raises(ValueError, match="x must be on the CPU or on the stream's device cuda:0"):
            stream.step(torch.zeros(1, 16, device="meta"))
        with pytest.raises(ValueError, match="out on the GPU must be dense"):
            stream.step(x[0], out=not_dense)
        y0_cpu, out_cpu, y2_cpu = y0.cpu(), out.cpu(), y2.cpu()
    assert y0.device.type == "cuda" and y2.device.type == "cuda"
    assert rel_err(y0_cpu, y_ref[0]) < 1e-5 and rel_err(out_cpu, y_ref[1, 0]) < 1e-5
    assert rel_err(y2_cpu, y_ref[2]) < 1e-5


@cuda_test(120)
@pytest.mark.hang_guard(60)
def test_cuda_close_and_reopen_cycles():
    check_open_close_cycles(cuda_module("rnn", 32, 256), torch.randn(1, 32), 100)
    torch.cuda.synchronize()  # nothing left running


@cuda_test(120)
@pytest.mark.hang_guard(60)
def test_cuda_collected_stream_frees_its_sms():
    module = cuda_module("gru", 32, 256)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    stream = torch_prnn.Stream(module)
    held = stream.sms
    del stream
    gc.collect()
    streams = [torch_prnn.Stream(module) for _ in range((sms - 1) // held)]  # every SM again but the free one
    assert all(s.sms == held for s in streams)
    for s in streams:
        s.close()
    torch.cuda.synchronize()


@cuda_test(120)
@pytest.mark.hang_guard(60)
def test_cuda_refresh():
    check_refresh(cuda_module("rnn", 32, 256), torch.randn(3, 1, 32))


@cuda_test(120)
@pytest.mark.hang_guard(90)
def test_cuda_other_work_runs_beside_an_open_stream():
    a = torch.randn(4096, 4096, device="cuda")
    c = torch.empty_like(a)  # the GEMMs write into it: no allocation beside the stream either
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.mm(a, a, out=c)  # loaded and warmed up before any stream opens
        ref = c.clone()
    side.synchronize()
    for hidden in (256, 1024):  # a stream of a few SMs, and one of most of them
        module = cuda_module("rnn", hidden, hidden)
        xs = torch.randn(64, 1, hidden)
        with torch_prnn.Stream(module) as stream:
            done = torch.cuda.Event()
            with torch.cuda.stream(side):
                for _ in range(20):
                    torch.mm(a, a, out=c)
                done.record()
            deadline, steps = time.monotonic() + 30, 0
            while not done.query():
                # A GEMM kernel that needs more SMs at once than the stream leaves (a cluster launch) waits for it.
                assert time.monotonic() < deadline, f"the GEMMs did not finish beside a stream of {stream.sms} SMs"
                stream.step(xs[steps % 64])
                steps += 1
        assert steps > 0
        side.synchronize()
        assert torch.allclose(c, ref, rtol=1e-2, atol=1e-1)  # after the stream closed: new kernels are safe


@cuda_test(120)
@pytest.mark.hang_guard(60)
def test_cuda_refuses_a_stream_that_does_not_fit_beside_the_open_ones():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    big = cuda_module("rnn", 1024, 1024)
    small = cuda_module("rnn", 64, 64)  # before any stream opens: its initialisation launches kernels
    with torch_prnn.Stream(big) as first:
        held = first.sms
        with pytest.raises(RuntimeError, match=r"cannot hold this stream beside the open ones, which hold"):
            torch_prnn.Stream(big)
        others = []
        try:
            for _ in range(sms):  # until every SM is held
                others.append(torch_prnn.Stream(small))
        except RuntimeError as error:
            assert "SMs" in str(error), error
        assert held + sum(s.sms for s in others) <= sms - 1  # one SM stays free
        for s in others:  # every open stream still answers
            assert s.step(torch.zeros(1, 64)).shape == (1, 64)
            s.close()
    with torch_prnn.Stream(big, max_sms=40) as capped:  # the SMs are free again; max_sms caps the grid
        assert capped.sms <= 40
    with pytest.raises(NotImplementedError, match="fit in shared memory"):
        torch_prnn.Stream(big, max_sms=4)


@cuda_test(120)
@pytest.mark.hang_guard(90)
def test_cuda_interpreter_exit_ends_the_kernel():
    code = (
        "import torch, torch_prnn\n"
        "m = torch_prnn.PersistentRNN(16, 256, device='cuda')\n"
        "s = torch_prnn.Stream(m)\n"
        "s.step(torch.zeros(1, 16))\n"
        "t = torch_prnn.Stream(m)\n"
        "print('open', s.sms + t.sms)\n"  # both left open: atexit closes them
    )
    rc, out = run_python(["-c", code], timeout=SUBPROCESS_TIMEOUT)
    assert rc == 0 and "open" in out, out


BESIDE_A_STREAM = """
import torch, torch_prnn
torch.manual_seed(0)
side = torch.cuda.Stream()
held = torch_prnn.PersistentRNN(16, 2048, device="cuda").eval()  # the stream's module: all SMs but a few
cells = {"rnn": torch_prnn.PersistentRNN, "lstm": torch_prnn.PersistentLSTM, "gru": torch_prnn.PersistentGRU}


def tiers():
    return {cell: torch_prnn.plan(256, batch=4, steps=64, device="cuda", cell=cell)["tier"] for cell in cells}


def forwards(cases):
    with torch.cuda.stream(side), torch.no_grad():  # on the side stream both times: its blocks cached
        ys = [module(x)[0] for module, x in cases]
    side.synchronize()  # a launch waiting for the SMs the stream holds would wait here
    return ys


cases = []
for cls in cells.values():
    cases.append((cls(48, 256, device="cuda").eval(), torch.randn(64, 4, 48, device="cuda")))
alone, tiers_alone = forwards(cases), tiers()
with torch_prnn.Stream(held) as stream:
    sms, tiers_beside = stream.sms, tiers()
    print("stream of", sms, "SMs; tiers", tiers_alone, "then", tiers_beside, flush=True)
    beside = forwards(cases)
    stream.step(torch.zeros(1, 16))
assert sms > 0 and all(t != "stepwise" for t in tiers_alone.values()), tiers_alone
assert all(t == "stepwise" for t in tiers_beside.values()), tiers_beside
assert tiers() == tiers_alone  # the SMs given back
for cell, a, b in zip(cells, alone, beside):
    err = (a - b).abs().max().item()
    print(cell, "max difference", err, flush=True)
    assert err < 2e-5, (cell, err)
print("beside: ok")
"""


@cuda_test(120)
@pytest.mark.hang_guard(90)
def test_cuda_layers_run_beside_an_open_stream():
    """While a stream holds SMs, torch_prnn's layers on the device plan the
    tiers of plain launches (a persistent launch would wait for SMs the
    stream never frees), whose kernels the stream loaded as it opened: a
    PersistentRNN (its input projection in the few-steps kernel, as it was
    in the persistent one), PersistentLSTM and PersistentGRU (their GEMM as
    before) forward on another CUDA stream finish beside a stream that holds
    all SMs but a few, under lazy loading, and match their results before it opened
    (another tier: float32 rounding); after it closes the tiers are back."""
    rc, out = run_python(["-c", BESIDE_A_STREAM], timeout=SUBPROCESS_TIMEOUT,
                         env_extra={"CUDA_MODULE_LOADING": "LAZY"})
    assert rc == 0 and "beside: ok" in out, out


@cuda_test(120)
@pytest.mark.hang_guard(60)
def test_cuda_warmed_up_kernels_run_beside_an_open_stream():
    """CUDA loads a kernel at its first launch (lazy loading, the default),
    and that load waits for the device to be idle: never, while a stream is
    open. Kernels launched once before the stream opens (here a GEMM and an
    elementwise op, as the README tells users to warm them up) run beside it,
    on another CUDA stream (torch_prnn's own layers: the test above)."""
    m = torch_prnn.PersistentRNN(16, 256, device="cuda")
    a = torch.randn(512, 512).cuda()
    side = torch.cuda.Stream()

    def work():
        with torch.cuda.stream(side):
            c = (a @ a).tanh_()
        side.synchronize()
        return c

    c0 = work().cpu()  # every kernel it runs loaded before the stream opens; its blocks cached
    with torch_prnn.Stream(m) as s:
        c = work()
        shape = s.step(torch.zeros(1, 16)).shape
    assert shape == (1, 256)
    assert torch.allclose(c.cpu(), c0)


def _last_unfinished_case(out):
    """The last test case that pytest -v started in `out` without an outcome, or None."""
    outcomes = ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL", "XPASS")
    started = [line for line in out.splitlines() if "test_stream.py::" in line]
    last = started[-1] if started else ""
    return None if not last or any(o in last for o in outcomes) else last.split()[0]


@pytest.mark.skipif(CHILD or not GPU_TESTS,
                    reason="needs CUDA and PRNN_STREAM_GPU_TESTS=1 (runs each CUDA test of the resident kernel in a "
                           "child process with a time limit)")
@pytest.mark.parametrize("name", list(CUDA_TESTS))
def test_cuda_in_a_child(name):
    """The CUDA test `name` (all its cases) in a child pytest process that
    must end within its limit: a hang fails here, naming the case that hung
    (the child's hang guard also prints every thread's traceback)."""
    limit = CUDA_TESTS[name]
    args = ["-m", "pytest", "-v", "-x", "-p", "no:cacheprovider", f"tests/test_stream.py::{name}"]
    try:
        rc, out = run_python(args, timeout=limit, env_extra={"PRNN_STREAM_CHILD": "1", "PYTHONUNBUFFERED": "1"})
    except pytest.fail.Exception as failure:  # run_python's timeout, with the child's output
        pytest.fail(f"{name} ran past {limit} s, hung in {_last_unfinished_case(str(failure))}:\n{failure}",
                    pytrace=False)
    hung = _last_unfinished_case(out)
    assert rc == 0 and re.search(r"\b\d+ passed\b", out), (
        f"{name}: exit status {rc}" + (f", ended inside {hung}" if hung else "") + f":\n{out[-6000:]}")
