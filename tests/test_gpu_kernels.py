"""GPU kernels through the ops: parity with a float64 reference across tiers,
dtypes, activations, odd sizes, lengths and layouts; capture in CUDA graphs;
concurrent streams. Skipped without CUDA."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import conftest
import torch_prnn  # noqa: F401  (registers the ops)
from conftest import (cluster_tier_available, layer_reference, poison_allocator, reference_final_state, reference_forward,
                      rel_err, run_python, run_threads)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Relative-error bounds against the float64 reference (DESIGN.md: numerics);
# the float64 kernels are held tighter here than in the module tests.
TOL = {**conftest.TOL, torch.float64: 1e-12}
ON_CHIP = ("persistent_registers", "persistent_shared", "persistent_cluster", "persistent_cluster_grid")


def assert_float32_tier(H, B):
    """float32's tier on this GPU where the cluster tiers are on: one cluster
    up to H = 1152, several up to 2048 at B >= 5; else the grid."""
    tier = torch_prnn.plan(H, batch=B, device="cuda")["tier"]
    if cluster_tier_available() and H <= 1152:
        assert tier == "persistent_cluster", (H, B, tier)
    elif cluster_tier_available() and H <= 2048 and B >= 5:
        assert tier == "persistent_cluster_grid", (H, B, tier)
    else:
        assert tier in ("persistent_registers", "persistent_shared"), (H, B, tier)


def reference_backward(grad_y, y, h0, w, lengths, nonlinearity):
    """float64 backward-data given the forward's y: delta_t = act'(y_t) (g_t + W^T delta_{t+1}),
    zero past a length; then grad_h0 = delta_0 W and grad_W = sum_t delta_t^T h_{t-1}."""
    T, B, H = y.shape
    lens = lengths.to(y.device) if lengths is not None else torch.full((B,), T, device=y.device)
    dact = (1 - y * y) if nonlinearity == "tanh" else (~(y <= 0)).double()  # relu': torch's, 1 at NaN
    carry, deltas = torch.zeros_like(h0), [None] * T
    for t in reversed(range(T)):
        d = dact[t] * (grad_y[t] + carry @ w)
        d = torch.where((t < lens).unsqueeze(1), d, torch.zeros_like(d))
        deltas[t], carry = d, d
    delta = torch.stack(deltas)
    prev = torch.cat([h0.unsqueeze(0), y[:-1]])
    return delta, delta[0] @ w, torch.einsum("tbi,tbj->ij", delta, prev)


def make_problem(T, B, H, dtype, nonlinearity="tanh", lengths=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    xp = torch.randn(T, B, H, device="cuda", generator=g).to(dtype)
    h0 = (0.5 * torch.randn(B, H, device="cuda", generator=g)).to(dtype)
    bound = H ** -0.5
    w = ((torch.rand(H, H, device="cuda", generator=g) * 2 - 1) * bound).to(dtype)
    lens = None
    if lengths:
        lens = torch.randint(0, T + 1, (B,), generator=torch.Generator().manual_seed(seed))
        lens[0] = T  # at least one full-length sequence
    return xp, h0, w, lens


def check_forward(T, B, H, dtype, nonlinearity, lengths=False, seed=0):
    xp, h0, w, lens = make_problem(T, B, H, dtype, nonlinearity, lengths, seed)
    poison_allocator("cuda", dtype, (T, B, H), (B, H))
    y, h_n = torch.ops.prnn.forward(xp, h0, w, lens, nonlinearity)
    ref = reference_forward(xp.double(), h0.double(), w.double(), lens, nonlinearity)
    err = rel_err(y, ref)
    assert err < TOL[dtype], f"forward T={T} B={B} H={H} {dtype} {nonlinearity}: rel err {err:.3g}"
    assert torch.equal(h_n, reference_final_state(y, h0, lens)), "h_n: not y's final state"
    return xp, h0, w, lens, y


def check_backward(T, B, H, dtype, nonlinearity, lengths=False, seed=0):
    xp, h0, w, lens, y = check_forward(T, B, H, dtype, nonlinearity, lengths, seed)
    grad_y = torch.randn(T, B, H, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed + 1))
    grad_y = grad_y.to(dtype)
    poison_allocator("cuda", dtype, (T, B, H))
    gxp, gh0, gw = torch.ops.prnn.backward(grad_y, y, h0, w, lens, nonlinearity)
    # The op's own definition: the float64 recursion over the kernel's y.
    refs = reference_backward(grad_y.double(), y.double(), h0.double(), w.double(), lens, nonlinearity)
    for name, out, r in zip(("grad_xp", "grad_h0", "grad_w_hh"), (gxp, gh0, gw), refs):
        err = rel_err(out, r)
        assert err < TOL[dtype], f"{name} T={T} B={B} H={H} {dtype} {nonlinearity}: rel err {err:.3g}"
    if dtype in (torch.float32, torch.float64):  # end to end: autograd through the float64 forward
        xp64, h064, w64 = (t.double().requires_grad_() for t in (xp, h0, w))
        ref = reference_forward(xp64, h064, w64, lens, nonlinearity)
        for name, out, r in zip(("grad_xp", "grad_h0", "grad_w_hh"), (gxp, gh0, gw),
                                torch.autograd.grad(ref, (xp64, h064, w64), grad_y.double())):
            err = rel_err(out, r)
            assert err < 10 * TOL[dtype], f"{name} (end to end) T={T} B={B} H={H} {dtype}: rel err {err:.3g}"


SIZES = [  # (T, B, H): every H, B and T the issue names, each at least once
    (1, 1, 1), (2, 3, 7), (255, 4, 33), (2, 17, 129), (255, 1, 1000), (255, 4, 1024),
    (2, 17, 1024), (255, 3, 2048), (1, 4, 2048), (255, 4, 2816), (2, 1, 2816), (255, 17, 7),
    # cluster tier boundaries: 16 bits 5 CTAs x 3 clusters; the first and last H of 72
    # rows a CTA (both cluster kernels); the first size past one cluster
    (100, 20, 300), (50, 2, 1025), (50, 3, 1152), (20, 2, 1153),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
@pytest.mark.parametrize("T,B,H", SIZES)
def test_forward_matches_reference(T, B, H, dtype, nonlinearity):
    check_forward(T, B, H, dtype, nonlinearity)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
@pytest.mark.parametrize("T,B,H", SIZES)
def test_backward_matches_reference(T, B, H, dtype, nonlinearity):
    check_backward(T, B, H, dtype, nonlinearity)


@pytest.mark.parametrize("dtype", DTYPES + [torch.float64], ids=str)
@pytest.mark.parametrize("T,B,H", [(37, 5, 33), (64, 9, 1024), (20, 4, 2816)])
def test_lengths(T, B, H, dtype):
    check_backward(T, B, H, dtype, "tanh", lengths=True, seed=3)


def test_float64_runs_stepwise():
    assert torch_prnn.plan(64, batch=4, dtype=torch.float64, device="cuda")["tier"] == "stepwise"
    check_backward(50, 3, 64, torch.float64, "tanh")
    check_backward(50, 3, 64, torch.float64, "relu", lengths=True)


def test_on_chip_coverage():
    """The on-chip tier covers H = 2048 in float32 and H = 2816 at 16 bits (B = 4)."""
    for dtype, H in ((torch.float32, 2048), (torch.bfloat16, 2816), (torch.float16, 2816)):
        for backward in (False, True):
            p = torch_prnn.plan(H, batch=4, steps=256, dtype=dtype, device="cuda", backward=backward)
            assert p["tier"] in ON_CHIP, (dtype, H, p)


def test_cluster_tier_choice():
    """On sm_90, H up to 1152 runs on clusters of at least two CTAs, 64
    rows a CTA up to H = 1024 and 72 past it. The 16-bit dtypes take the
    tensor-core kernel, 1 to 8 sequences per cluster: as few as the device's
    room for clusters allows. float32 takes the FFMA kernel, one sequence per
    cluster, and a batch past the room runs as clusters free. Larger H keeps
    the grid-wide kernel."""
    if not cluster_tier_available():
        pytest.skip("the cluster tier is off here (before sm_90, or PRNN_DISABLE_CLUSTER_TIER)")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for H, B in ((1, 1), (64, 8), (65, 9), (1000, 4), (1024, 17), (1024, 200), (1025, 4), (1152, 17)):
            for backward in (False, True):
                p = torch_prnn.plan(H, batch=B, dtype=dtype, device="cuda", backward=backward)
                assert p["tier"] == "persistent_cluster", (dtype, H, p)
                rows = 72 if H > 1024 else 64
                assert p["rows_per_cta"] == rows, (dtype, H, p)
                ctas = max(2, -(-H // rows))
                groups, rest = divmod(p["grid"], ctas)
                assert rest == 0 and -(-B // 8) <= groups <= B and p["workspace_bytes"] == 0, p
                if dtype == torch.float32:
                    assert groups == B, (H, B, p)
                else:  # one sequence per cluster if they all fit at once; groups of 8 only when they must
                    assert groups == B or groups == -(-B // 8) or groups * ctas <= sms, (H, B, p)
                    if H > 1024:  # the tensor-core kernel's 72-row shape, not the FFMA kernel's
                        # cluster_smem_bytes(1152, 72): 128 + 1152 (72 + 8) 2 for staging W_hh^T
                        assert p["smem_bytes"] == 128 + 1152 * 80 * 2, p
                        if B * ctas > sms:  # not one sequence a cluster: grouped
                            assert groups < B, (H, B, p)
        assert torch_prnn.plan(4, batch=3, dtype=dtype, device="cuda")["grid"] == 2 * 3
        expected = 16 * 200 if dtype == torch.float32 else 16 * 25
        assert torch_prnn.plan(1024, batch=200, dtype=dtype, device="cuda")["grid"] == expected
        assert torch_prnn.plan(1153, batch=4, dtype=dtype, device="cuda")["tier"] != "persistent_cluster"


def test_cluster_grid_choice():
    """On sm_90, H from 1153 to 2048 at B >= 5 runs on the cluster grid:
    ceil(H / 160) clusters of 8 CTAs of 20 rows each, every batch in one launch (groups
    of 8 sequences in turn), with a workspace of 4 KiB of flags and two
    exchange buffers of 8 sequences. B <= 4, and H past 2048, keep the
    grid-wide kernel."""
    if not cluster_tier_available():
        pytest.skip("the cluster tier is off here (before sm_90, or PRNN_DISABLE_CLUSTER_TIER)")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for H in (1153, 1280, 1281, 2047, 2048):
            for B, backward in ((5, False), (9, True), (200, False)):
                p = torch_prnn.plan(H, batch=B, dtype=dtype, device="cuda", backward=backward)
                G = -(-H // 160)
                assert p["tier"] == "persistent_cluster_grid", (dtype, H, B, p)
                assert p["rows_per_cta"] == 20 and p["grid"] == 8 * G and p["block"] == 256, p
                assert p["workspace_bytes"] == 4096 + 2 * 8 * 160 * G * 4, p
            for B in (1, 4):
                p = torch_prnn.plan(H, batch=B, dtype=dtype, device="cuda")
                assert p["tier"] in ("persistent_registers", "persistent_shared"), (dtype, H, B, p)
        p = torch_prnn.plan(2049, batch=8, dtype=dtype, device="cuda")
        assert p["tier"] in ("persistent_registers", "persistent_shared", "stepwise"), p


GRID_CLUSTER_CASES = [(dtype, H) for dtype in DTYPES for H in (1153, 1300, 1441, 2048)]


@pytest.mark.parametrize("dtype,H", GRID_CLUSTER_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("B", [5, 9, 17])
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_cluster_grid(dtype, H, B, nonlinearity):
    """The cluster grid: odd H (padding rows publish zeros: 1441 takes 10
    clusters, 1600 rows, 159 of them padding; 2048 takes 13, 2080 rows, past
    the kernel's K extent of 2048), a partial group, two and three groups
    of 8 in one launch (a group's h0 replaces the state
    the one before left). Forward and backward with lengths, against
    float64."""
    if not cluster_tier_available():
        pytest.skip("the cluster tier is off here (before sm_90, or PRNN_DISABLE_CLUSTER_TIER)")
    assert torch_prnn.plan(H, batch=B, dtype=dtype, device="cuda")["tier"] == "persistent_cluster_grid"
    for T, lengths in ((1, False), (2, True), (37, True)):
        check_backward(T, B, H, dtype, nonlinearity, lengths=lengths, seed=H + B)


CLUSTER_CASES = [(torch.float32, H) for H in (1, 7, 64, 65, 129, 256, 257, 500, 512, 513, 1000, 1024, 1025, 1100,
                                               1151, 1152)] + [
    (dtype, H) for dtype in (torch.bfloat16, torch.float16) for H in (7, 65, 257, 513, 1000, 1025, 1100, 1151, 1152)]


@pytest.mark.parametrize("dtype,H", CLUSTER_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("B", [1, 3, 17])
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_cluster_kernels(dtype, H, B, nonlinearity):
    """The cluster kernels, every shape: the FFMA kernel (float32) with all
    8 rows of a warp in registers up to H = 512, 6 of 8 up to 1024, 5 of 9
    up to 1152; the tensor-core kernel (16-bit) at 64 rows a CTA up to 1024
    and 72 past it (4 m-tiles and half of a fifth, an odd count of k-tiles).
    B = 17 is more clusters than the H200 holds at once at H >= 1024 (7), in
    groups of 3 sequences on the tensor-core kernel. Forward and backward
    with lengths, against float64."""
    if not cluster_tier_available():
        pytest.skip("the cluster tier is off here (before sm_90, or PRNN_DISABLE_CLUSTER_TIER)")
    assert torch_prnn.plan(H, batch=B, dtype=dtype, device="cuda")["tier"] == "persistent_cluster"
    for T, lengths in ((1, False), (2, True), (67, True)):
        check_backward(T, B, H, dtype, nonlinearity, lengths=lengths, seed=H + B)


def make_layer(T, B, I, H, dtype, bias=True, lengths=False, seed=0, aligned=False):
    """prnn::layer's inputs, x and w_ih strided: x every other sequence of a
    wider input, w_ih with a wider row pitch; at an odd offset (4-byte
    aligned in float32, 2-byte in 16 bits), or with aligned=True at offset 0
    and pitches of a multiple of 8 elements (16-byte aligned rows, whatever
    I is)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    wide = (I + 7) // 8 * 8 + 8
    if aligned:
        x = torch.randn(T, 2 * B, wide, device="cuda", generator=g).to(dtype)[:, ::2, :I]
    else:
        x = torch.randn(T, 2 * B, I + 2, device="cuda", generator=g).to(dtype)[:, ::2, 1:I + 1]
    bound = H ** -0.5
    w_ih = ((torch.rand(H, wide if aligned else I + 3, device="cuda", generator=g) * 2 - 1) * bound).to(dtype)
    w_ih = w_ih[:, :I] if aligned else w_ih[:, 2:I + 2]
    b = [((torch.rand(H, device="cuda", generator=g) * 2 - 1) * bound).to(dtype) if bias else None
         for _ in range(2)]
    _, h0, w_hh, lens = make_problem(T, B, H, dtype, lengths=lengths, seed=seed + 1)
    return x, w_ih, b[0], b[1], h0, w_hh, lens


def check_layer(T, B, I, H, dtype, nonlinearity="tanh", bias=True, lengths=False, seed=0, aligned=False):
    args = make_layer(T, B, I, H, dtype, bias, lengths, seed, aligned)
    poison_allocator("cuda", dtype, (T, B, H), (B, H))
    y, h_n = torch.ops.prnn.layer(*args, nonlinearity)
    ref = layer_reference(*[a.double() if torch.is_tensor(a) and a.is_floating_point() else a for a in args],
                          nonlinearity)
    # Bounded by TOL, or by torch's own error in this dtype where that is larger
    # (a few elements in 16 bits, relu near its kink): the projection and each
    # step of the loop in `dtype`.
    xp = args[0] @ args[1].t() + (args[2] + args[3] if bias else 0)
    torch_err = rel_err(reference_forward(xp, args[4], args[5], args[6], nonlinearity, dtype=dtype), ref)
    err = rel_err(y, ref)
    assert err < max(TOL[dtype], 4 * torch_err), (
        f"layer T={T} B={B} I={I} H={H} {dtype} {nonlinearity}: rel err {err:.3g} (torch's {torch_err:.3g})")
    assert torch.equal(h_n, reference_final_state(y, args[4], args[6])), "h_n: not y's final state"
    return args, y


def test_fused_layer_choice():
    """Where prnn::layer computes its input projection inside the recurrence's
    launch: a cluster kernel's forward (the FFMA kernel's, float32; the
    tensor-core kernel's, 16-bit, H <= 1152), with clusters
    to spare beside the batch's that keep ahead of it (H200: 7 clusters of 16
    CTAs at H = 1024, so B <= 4 at I = H; from B = 5 on too few are left, at
    B = 7 none)."""
    if not cluster_tier_available():
        pytest.skip("the cluster tier is off here (before sm_90, or PRNN_DISABLE_CLUSTER_TIER)")

    def fused(H, B, I, dtype=torch.float32, **kw):
        return torch_prnn.plan(H, batch=B, steps=256, dtype=dtype, device="cuda", input_size=I, **kw)[
            "fused_input_projection"]

    for B in (1, 2, 4):
        assert fused(1024, B, 1024) and fused(1152, B, 1152), B
    for dtype in (torch.bfloat16, torch.float16):  # the tensor-core kernel, R = 64 and 72
        assert fused(1024, 4, 1024, dtype) and fused(7, 1, 1, dtype) and fused(513, 3, 129, dtype)
        assert fused(1025, 1, 1025, dtype) and fused(1152, 4, 1152, dtype)
        assert not fused(1024, 5, 1024, dtype) and not fused(1152, 5, 1152, dtype)
    assert fused(512, 4, 512) and fused(7, 1, 1) and fused(1024, 4, 33)
    for B in (5, 6, 7, 17):
        assert not fused(1024, B, 1024), B
    assert fused(7, 8, 1) and not fused(7, 33, 1)  # an item's 32 columns hold a whole step
    assert not fused(1024, 4, 20000) and not fused(1024, 4, 2048)  # the projection would outrun the producers
    assert not fused(64, 4, 64, torch.float64) and not fused(2048, 4, 2048)
    assert not fused(1024, 4, 1024, backward=True) and not fused(1024, 4, 0)
    p = torch_prnn.plan(1024, batch=2, steps=256, device="cuda", input_size=1024)
    assert p["tier"] == "persistent_cluster" and p["workspace_bytes"] >= 256 * 2 * 1024 * 4, p


FUSED_CASES = [  # (dtype, H, I, B): both kernels' shapes, odd input sizes, the largest batches fused
    (torch.float32, 1024, 1024, 4), (torch.float32, 1024, 1000, 1), (torch.float32, 1000, 7, 3),
    (torch.float32, 129, 1000, 2), (torch.float32, 1152, 33, 4), (torch.float32, 1, 1, 1), (torch.float32, 7, 1, 3),
    (torch.float32, 513, 513, 4), (torch.float32, 256, 300, 5), (torch.float32, 1100, 1100, 2),
    (torch.float32, 1025, 129, 3), (torch.bfloat16, 1024, 1024, 4), (torch.float16, 1024, 1000, 1),
    (torch.bfloat16, 1000, 7, 3), (torch.float16, 129, 1000, 2), (torch.bfloat16, 1, 1, 1), (torch.float16, 7, 1, 3),
    (torch.bfloat16, 513, 513, 4), (torch.float16, 256, 300, 5), (torch.bfloat16, 1152, 1152, 4),
    (torch.float16, 1100, 33, 2), (torch.bfloat16, 1025, 1000, 3)]


@pytest.mark.parametrize("dtype,H,I,B", FUSED_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_fused_layer(dtype, H, I, B, bias, nonlinearity):
    """prnn::layer with its input projection in the recurrence's launch, on
    strided x and w_ih, with and without biases and lengths, against float64;
    T = 255 is many chunks of steps (32 columns of (step, sequence) each).
    Rows of x and w_ih 16-byte aligned (staged 16 bytes at a time, the last
    chunk of K partly when I is not a multiple of 16 bytes) and not (float32
    4 bytes at a time, 16-bit by plain loads)."""
    if not cluster_tier_available():
        pytest.skip("the cluster tier is off here (before sm_90, or PRNN_DISABLE_CLUSTER_TIER)")
    p = torch_prnn.plan(H, batch=B, steps=255, dtype=dtype, device="cuda", input_size=I)
    assert p["fused_input_projection"] and p["tier"] == "persistent_cluster", p
    # T = 1 with lengths: the cluster kernel (without them the few-steps kernel takes it).
    for T, lengths, aligned in ((1, True, False), (2, True, True), (67, False, False), (67, False, True),
                                (255, True, True)):
        check_layer(T, B, I, H, dtype, nonlinearity, bias, lengths, seed=H + I + B, aligned=aligned)


def test_few_steps_choice():
    """Where prnn::layer runs a launch a step with the input projection in it
    (the few-steps kernel): one step of up to 16 sequences, or two of up to 4,
    without lengths, every dtype and size, any GPU; the recurrence alone, a
    backward, lengths, a longer sequence or a larger batch plan as before."""
    def tier(H, B, T, I=64, **kw):
        return torch_prnn.plan(H, batch=B, steps=T, device="cuda", input_size=I, **kw)["tier"]

    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for H, B, T in ((1, 1, 1), (1024, 1, 1), (1024, 16, 1), (4096, 4, 2), (7, 3, 2)):
            assert tier(H, B, T, dtype=dtype) == "few_steps", (dtype, H, B, T)
    p = torch_prnn.plan(1024, batch=4, steps=1, device="cuda", input_size=1024)
    assert p["fused_input_projection"] and p["workspace_bytes"] == 0 and p["grid"] == 128, p
    assert tier(1024, 4, 3) != "few_steps" and tier(1024, 5, 2) != "few_steps" and tier(1024, 17, 1) != "few_steps"
    assert tier(1024, 4, 1, lengths=True) != "few_steps" and tier(1024, 4, 1, I=0) != "few_steps"
    assert tier(1024, 4, 1, backward=True) != "few_steps"


FEW_STEPS_CASES = [  # (H, I, B): one warp's rows, odd sizes, whole and partial sequence tiles
    (1024, 1024, 1), (1024, 1000, 4), (1, 1, 1), (7, 3, 3), (129, 33, 16), (520, 2056, 5), (2048, 512, 2)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("H,I,B", FEW_STEPS_CASES, ids=lambda v: str(v))
def test_few_steps_layer(dtype, H, I, B):
    """The few-steps kernel against float64 for each T it takes, with and
    without biases, tanh and relu, on strided x and w_ih both 16-byte aligned
    (its vector loads, where I and H are multiples of a vector) and not
    (element loads); h_n is y's last step."""
    for T in (1, 2) if B <= 4 else (1,):
        assert torch_prnn.plan(H, batch=B, steps=T, dtype=dtype, device="cuda", input_size=I)["tier"] == "few_steps"
        for bias, nonlinearity, aligned in ((True, "tanh", True), (False, "relu", False), (True, "relu", T == 2)):
            check_layer(T, B, I, H, dtype, nonlinearity, bias, seed=H + I + B + T, aligned=aligned)
    if B <= 4:
        assert torch_prnn.plan(H, batch=B, steps=3, dtype=dtype, device="cuda", input_size=I)["tier"] != "few_steps"


def test_few_steps_layer_broadcast_and_graph():
    """The few-steps kernel on a stride-0 batch of x and h0 (one input and
    state for every sequence), and replayed in a CUDA graph on new x with
    the bits of the eager call."""
    T, B, I, H = 2, 4, 96, 256
    assert torch_prnn.plan(H, batch=B, steps=T, device="cuda", input_size=I)["tier"] == "few_steps"
    x, w_ih, b_ih, b_hh, h0, w_hh, _ = make_layer(T, B, I, H, torch.float32, seed=80, aligned=True)
    xb, h0b = x[:, :1].expand(T, B, I), h0[:1].expand(B, H)
    y, h_n = torch.ops.prnn.layer(xb, w_ih, b_ih, b_hh, h0b, w_hh, None, "tanh")
    ref = layer_reference(*[a.double() for a in (xb, w_ih, b_ih, b_hh, h0b, w_hh)], None, "tanh")
    assert rel_err(y, ref) < TOL[torch.float32] and torch.equal(h_n, y[-1])
    assert torch.equal(y, y[:, :1].expand_as(y))  # every sequence the same
    static_x = x.clone()
    torch.ops.prnn.layer(static_x, w_ih, b_ih, b_hh, h0, w_hh, None, "tanh")  # warm up before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_outputs = torch.ops.prnn.layer(static_x, w_ih, b_ih, b_hh, h0, w_hh, None, "tanh")
    for seed in range(2):
        fresh = make_layer(T, B, I, H, torch.float32, seed=81 + seed, aligned=True)[0]
        static_x.copy_(fresh)
        graph.replay()
        expected = torch.ops.prnn.layer(fresh, w_ih, b_ih, b_hh, h0, w_hh, None, "tanh")
        torch.testing.assert_close(static_outputs, expected, rtol=0, atol=0)  # y and h_n


@pytest.mark.hang_guard(120)  # conftest: a hang ends the run with tracebacks
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_layer_graph_streams_and_busy_gpu(dtype):
    """The fused layer (the FFMA kernel's in float32, the tensor-core
    kernel's in bf16) captured in a CUDA graph and replayed on new x; two at
    once on their own streams; one launched while another stream keeps the
    SMs busy (its producers and steppers must all be resident: a wait, not a
    deadlock)."""
    if not cluster_tier_available():
        pytest.skip("the cluster tier is off here (before sm_90, or PRNN_DISABLE_CLUSTER_TIER)")
    T, B, I, H = 64, 2, 1024, 1024
    assert torch_prnn.plan(H, batch=B, steps=T, dtype=dtype, device="cuda", input_size=I)["fused_input_projection"]
    x, w_ih, b_ih, b_hh, h0, w_hh, _ = make_layer(T, B, I, H, dtype, seed=60)
    static_x = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.ops.prnn.layer(static_x, w_ih, b_ih, b_hh, h0, w_hh, None, "tanh")
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_outputs = torch.ops.prnn.layer(static_x, w_ih, b_ih, b_hh, h0, w_hh, None, "tanh")
    for seed in range(3):
        fresh = make_layer(T, B, I, H, dtype, seed=61 + seed)[0]
        static_x.copy_(fresh)
        graph.replay()
        expected = torch.ops.prnn.layer(fresh, w_ih, b_ih, b_hh, h0, w_hh, None, "tanh")
        torch.testing.assert_close(static_outputs, expected, rtol=0, atol=0)  # y and h_n

    problems = [make_layer(200, B, I, H, dtype, seed=70 + i, aligned=i == 1) for i in range(2)]
    streams = [torch.cuda.Stream() for _ in problems]
    torch.cuda.synchronize()
    outs = []
    for args, st in zip(problems, streams):
        with torch.cuda.stream(st):
            outs.append(torch.ops.prnn.layer(*args, "tanh")[0])
    torch.cuda.synchronize()
    for args, y in zip(problems, outs):
        ref = layer_reference(*[a.double() if torch.is_tensor(a) and a.is_floating_point() else a for a in args], "tanh")
        assert rel_err(y, ref) < max(TOL[dtype], 1e-5)

    busy = torch.randn(4096, 4096, device="cuda")
    other = torch.cuda.Stream()
    with torch.cuda.stream(other):
        for _ in range(20):
            busy = busy @ busy
            busy = busy / busy.norm()
    args = problems[0]
    y, _ = torch.ops.prnn.layer(*args, "tanh")
    torch.cuda.synchronize()
    torch.testing.assert_close(y, outs[0], rtol=0, atol=0)


GRID_TIER_WITHOUT_CLUSTERS = """
import sys
sys.path.insert(0, "tests")
import torch
import torch_prnn
from test_gpu_kernels import check_backward
cases = ((torch.float32, 7, 3), (torch.float32, 33, 17), (torch.float32, 129, 5), (torch.float32, 1000, 4),
         (torch.float32, 1024, 40), (torch.float32, 1100, 3), (torch.bfloat16, 1000, 4), (torch.float16, 65, 9),
         (torch.bfloat16, 1100, 3))
for dtype, H, B in cases:
    tier = torch_prnn.plan(H, batch=B, dtype=dtype, device="cuda")["tier"]
    assert tier in ("persistent_registers", "persistent_shared"), (dtype, H, B, tier)
    check_backward(3, B, H, dtype, "tanh", lengths=True, seed=H)
    check_backward(5, B, H, dtype, "relu", seed=H + 1)
print("grid tier checked")
"""


@pytest.mark.hang_guard(300)
def test_grid_tier_when_clusters_are_off():
    """PRNN_DISABLE_CLUSTER_TIER=1 plans as GPUs without clusters (sm_80-89)
    do: the grid tier at every H. On sm_90 the cluster tier takes these sizes
    otherwise, so this is where the grid tier meets odd H and batches past
    one tile of sequences, forward and backward against float64."""
    rc, out = run_python(["-c", GRID_TIER_WITHOUT_CLUSTERS], timeout=240,
                         env_extra={"PRNN_DISABLE_CLUSTER_TIER": "1"})
    assert rc == 0 and "grid tier checked" in out, out[-4000:]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("B", [2, 5, 8, 13, 70])
def test_cluster_groups(dtype, B):
    """Every grouping of the batch over clusters (one sequence each at small B,
    groups of up to 8 at large B, more clusters than fit at once at B = 70 on
    H = 1024) gives each sequence its own result, with lengths."""
    check_backward(6, B, 1024, dtype, "tanh", lengths=True, seed=B)


def test_large_hidden_uses_slower_tier():
    H = 4096
    p = torch_prnn.plan(H, batch=2, dtype=torch.float32, device="cuda")
    assert p["tier"] == "stepwise", p
    check_backward(5, 2, H, torch.float32, "tanh")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_contiguous_inputs(dtype):
    T, B, H = 31, 5, 129
    xp_big, h0, w_big, _ = make_problem(T, 2 * B, H + 3, dtype, seed=7)
    xp = xp_big[:, ::2, 1:H + 1]  # strided batch, offset hidden
    w = w_big[1:H + 1, 2:H + 2]  # row stride H + 3
    h0 = h0[::2, :H]
    assert not xp.is_contiguous() and not w.is_contiguous()
    y, _ = torch.ops.prnn.forward(xp, h0, w, None, "tanh")
    ref = reference_forward(xp.double(), h0.double(), w.double(), None, "tanh")
    assert rel_err(y, ref) < TOL[dtype]
    grad_y = torch.randn(T, 1, H, device="cuda").to(dtype).expand(T, B, H)  # stride-0 batch
    gxp, gh0, gw = torch.ops.prnn.backward(grad_y, y, h0, w, None, "tanh")
    xp64, h064, w64 = (t.double().requires_grad_() for t in (xp, h0, w))
    r = torch.autograd.grad(reference_forward(xp64, h064, w64, None, "tanh"), (xp64, h064, w64), grad_y.double())
    for out, ref_g in zip((gxp, gh0, gw), r):
        assert rel_err(out, ref_g) < max(TOL[dtype], 1e-4)


class DenseCopiesOfBroadcast(TorchDispatchMode):
    """The ATen ops that read a tensor with a stride-0 dimension (a
    broadcast) of at least `numel` elements and return a dense one as large:
    a copy of the broadcast."""

    def __init__(self, numel):
        super().__init__()
        self.numel, self.copies = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace == "aten":
            def large(t, broadcast):
                return isinstance(t, torch.Tensor) and t.numel() >= self.numel and (0 in t.stride()) == broadcast
            reads_broadcast = any(large(t, True) for t in tree_leaves((args, kwargs)))
            if reads_broadcast and any(large(t, False) for t in tree_leaves(out)):
                self.copies.append(str(func))
        return out


def backward_op_call(cell, T, B, H):
    """A forward op's outputs and a function of grad_y that calls the cell's
    backward op on them (no autograd: what it allocates is the op's alone)."""
    gates = {"rnn": 1, "lstm": 4, "gru": 3}[cell]
    xp = torch.randn(T, B, gates * H, device="cuda")
    h0, w_hh = torch.randn(B, H, device="cuda"), torch.randn(gates * H, H, device="cuda") / H ** 0.5
    b_hh = torch.randn(gates * H, device="cuda")
    if cell == "rnn":
        y, _ = torch.ops.prnn.forward(xp, h0, w_hh, None, "tanh")
        return lambda grad_y: torch.ops.prnn.backward(grad_y, y, h0, w_hh, None, "tanh")
    if cell == "lstm":
        c0 = torch.randn(B, H, device="cuda")
        y, _, _, saved = torch.ops.prnn.lstm(xp, b_hh, h0, c0, w_hh, None, None, True)
        return lambda grad_y: torch.ops.prnn.lstm_backward(grad_y, None, None, h0, c0, y, saved, w_hh, None, None)
    y, _, saved = torch.ops.prnn.gru(xp, b_hh, h0, w_hh, None, True)
    return lambda grad_y: torch.ops.prnn.gru_backward(grad_y, None, h0, y, saved, w_hh, None)


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
def test_a_sums_gradient_is_not_copied_whole(cell):
    """loss = y.sum() gives the backward a grad_y whose every stride is 0:
    its values along H are copied (the kernels want a unit last stride), not
    the whole [T, B, H]. The backward op's peak memory is that of a dense
    grad_y made beforehand (measured on the op: through autograd the moment
    saved tensors are freed varies), and a module's gradients are the dense
    one's."""
    T, B, H = 64, 8, 256
    torch.manual_seed(3)
    dense, expanded = torch.ones(T, B, H, device="cuda"), torch.ones((), device="cuda").expand(T, B, H)
    assert expanded.stride() == (0, 0, 0)
    backward = backward_op_call(cell, T, B, H)

    def backward_peak(grad_y):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        grads = backward(grad_y)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before, grads

    backward_peak(dense)  # the backward's own workspaces allocated once
    dense_peak, want = backward_peak(dense)
    expanded_peak, got = backward_peak(expanded)
    whole = T * B * H * 4
    assert expanded_peak < dense_peak + whole // 4, (expanded_peak, dense_peak, whole)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)

    module = {"rnn": torch_prnn.PersistentRNN, "lstm": torch_prnn.PersistentLSTM,
              "gru": torch_prnn.PersistentGRU}[cell](H, H, device="cuda")
    x = torch.randn(T, B, H, device="cuda", requires_grad=True)
    params = [x, *module.parameters()]
    want = torch.autograd.grad(module(x)[0], params, dense)
    y = module(x)[0]
    with DenseCopiesOfBroadcast(whole // 4) as spy:
        got = torch.autograd.grad(y, params, expanded)
    assert not spy.copies, spy.copies  # nor on the way from autograd to the op
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("H,pitch,offset",
                         [(1000, 1024, 0), (1000, 1024, 8), (129, 136, 0), (129, 136, 1), (1000, 1024, 2),
                          (1100, 1104, 0), (1100, 1104, 2), (1100, 1104, 4), (1300, 1304, 2), (1300, 1304, 1)],
                         ids=["wide", "wide-offset", "wide-edge", "misaligned", "offset-2", "rows72-wide",
                              "rows72-offset-2", "rows72-offset-4", "grid-offset-2", "grid-misaligned"])
def test_cluster_weight_layouts(dtype, H, pitch, offset):
    """The cluster kernels stage W_hh (rows contiguous forward, columns
    backward): the 16-bit tensor-core kernel in 16-byte chunks (64 rows a
    CTA, and 72 at H = 1100), the float32 FFMA kernel 4 columns a load forward and element by element, consecutive rows
    across lanes, backward; wide loads where stride and alignment allow and
    element by element elsewhere: row pitch a multiple of the chunk or not, aligned or
    not, H not a multiple of the chunk (chunks across the edge). Past
    H = 1152, the cluster grid at B = 5 (element by element along the
    contiguous dimension)."""
    if not cluster_tier_available():
        pytest.skip("the cluster tier is off here (before sm_90, or PRNN_DISABLE_CLUSTER_TIER)")
    T, B = 9, (5 if H > 1152 else 3)
    tier = "persistent_cluster_grid" if H > 1152 else "persistent_cluster"
    assert torch_prnn.plan(H, batch=B, dtype=dtype, device="cuda")["tier"] == tier
    xp, h0, w_dense, _ = make_problem(T, B, H, dtype, seed=21)
    buf = torch.randn(H + 1, pitch, device="cuda").to(dtype)
    w = buf[1:, offset:offset + H]
    w.copy_(w_dense)
    assert w.stride(0) == pitch and w.data_ptr() % 16 == (w.element_size() * offset) % 16
    y, _ = torch.ops.prnn.forward(xp, h0, w, None, "tanh")
    ref = reference_forward(xp.double(), h0.double(), w.double(), None, "tanh")
    assert rel_err(y, ref) < TOL[dtype], "forward"
    grad_y = torch.randn(T, B, H, device="cuda").to(dtype)
    grads = torch.ops.prnn.backward(grad_y, y, h0, w, None, "tanh")
    grads_dense = torch.ops.prnn.backward(grad_y, y, h0, w_dense, None, "tanh")
    # The kernel's delta and the weight gradient (no W_hh in it) bit for bit;
    # grad_h0 = delta_0 W_hh is a cuBLAS GEMM, whose choice may follow the stride.
    for i, name in ((0, "xp"), (2, "w_hh")):
        assert torch.equal(grads[i], grads_dense[i]), f"grad {name}: strided W_hh differs from the dense copy"
    ref_grads = reference_backward(grad_y.double(), y.double(), h0.double(), w.double(), None, "tanh")
    for name, g, g_ref in zip(("xp", "h0", "w_hh"), grads, ref_grads):
        assert rel_err(g, g_ref) < max(TOL[dtype], 1e-4), f"grad {name}"


def test_cluster_grid_keeps_sequences_apart():
    """The cluster grid computes all 8 slots of a group, the ones past a
    last partial group too, where the state of the group before stays: a
    sequence that overflows to inf/NaN in the first group must not reach
    the others, nor sequence 8, which runs alone in slot 0 of the second."""
    if not cluster_tier_available():
        pytest.skip("the cluster tier is off here (before sm_90, or PRNN_DISABLE_CLUSTER_TIER)")
    T, B, H = 12, 9, 1300
    xp, h0, w, _ = make_problem(T, B, H, torch.float32, "relu", seed=70)
    assert torch_prnn.plan(H, batch=B, device="cuda")["tier"] == "persistent_cluster_grid"
    xp[:, 1] = 3e38  # relu: sequence 1 overflows to inf by the second step
    y, _ = torch.ops.prnn.forward(xp, h0, w, None, "relu")
    assert not torch.isfinite(y[-1, 1]).all()
    keep = [b for b in range(B) if b != 1]
    ref = reference_forward(xp[:, keep].double(), h0[keep].double(), w.double(), None, "relu")
    assert torch.isfinite(y[:, keep]).all()
    assert rel_err(y[:, keep], ref) < TOL[torch.float32]
    grad_y = torch.randn(T, B, H, device="cuda")
    grad_y[:, 1] = float("nan")
    gxp = torch.ops.prnn.backward(grad_y, y, h0, w, None, "relu")[0]
    assert torch.isfinite(gxp[:, keep]).all()


@pytest.mark.parametrize("H,B", [(1024, 4), (1280, 4), (2048, 9)])  # float32: a cluster, the grid, the cluster grid
def test_cuda_graph_capture_and_replay(H, B):
    T = 64
    assert_float32_tier(H, B)
    xp, h0, w, _ = make_problem(T, B, H, torch.float32, seed=11)
    static_xp = xp.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.ops.prnn.forward(static_xp, h0, w, None, "tanh")  # warm up outside capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_outputs = torch.ops.prnn.forward(static_xp, h0, w, None, "tanh")
    for seed in range(3):
        fresh, _, _, _ = make_problem(T, B, H, torch.float32, seed=100 + seed)
        static_xp.copy_(fresh)
        graph.replay()
        expected = torch.ops.prnn.forward(fresh, h0, w, None, "tanh")
        torch.testing.assert_close(static_outputs, expected, rtol=0, atol=0)  # y and h_n


@pytest.mark.hang_guard(120)  # conftest: a hang ends the run with tracebacks
def test_graph_replay_loop_stays_correct():
    T, B, H = 8, 2, 256
    xp, h0, w, _ = make_problem(T, B, H, torch.bfloat16, seed=12)
    torch.ops.prnn.forward(xp, h0, w, None, "tanh")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = torch.ops.prnn.forward(xp, h0, w, None, "tanh")
    expected = torch.ops.prnn.forward(xp, h0, w, None, "tanh")
    for _ in range(2000):
        graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(outputs, expected, rtol=0, atol=0)  # y and h_n


@pytest.mark.hang_guard(120)  # conftest: a hang ends the run with tracebacks
def test_two_streams_at_once():
    """Launches of every on-chip kind at once on their own streams: the grid
    tier and the cluster grid (cooperative), and the cluster tier."""
    problems = [make_problem(200, 4, 2304, torch.bfloat16, seed=20), make_problem(200, 3, 512, torch.bfloat16, seed=21),
                make_problem(200, 6, 1280, torch.float32, seed=22), make_problem(200, 9, 2048, torch.float16, seed=23)]
    streams = [torch.cuda.Stream() for _ in problems]
    outs = [None] * len(problems)
    torch.cuda.synchronize()
    for i, (prob, st) in enumerate(zip(problems, streams)):
        with torch.cuda.stream(st):
            xp, h0, w, _ = prob
            outs[i] = torch.ops.prnn.forward(xp, h0, w, None, "tanh")[0]
    torch.cuda.synchronize()
    for (xp, h0, w, _), y in zip(problems, outs):
        assert rel_err(y, reference_forward(xp.double(), h0.double(), w.double(), None, "tanh")) < TOL[xp.dtype]


@pytest.mark.hang_guard(120)  # conftest: a hang ends the run with tracebacks
@pytest.mark.parametrize("H,B", [(1024, 4), (1280, 4), (2048, 9)])  # float32: a cluster, the grid, the cluster grid
def test_beside_a_long_running_kernel(H, B):
    """A persistent launch while another stream keeps the SMs busy must wait, not deadlock."""
    assert_float32_tier(H, B)
    xp, h0, w, _ = make_problem(100, B, H, torch.float32, seed=30)
    busy = torch.randn(4096, 4096, device="cuda")
    other = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(other):
        for _ in range(20):
            busy = busy @ busy
            busy = busy / busy.norm()
    y, _ = torch.ops.prnn.forward(xp, h0, w, None, "tanh")
    torch.cuda.synchronize()
    assert rel_err(y, reference_forward(xp.double(), h0.double(), w.double(), None, "tanh")) < 1e-5


@pytest.mark.hang_guard(120)  # conftest: a hang ends the run with tracebacks
def test_many_threads_share_the_op():
    """8 threads, each on its own stream: the grid tier and the cluster grid
    (cooperative, a workspace each call) and single clusters."""
    problems = [make_problem(32, (1, 3, 2, 6)[i % 4], (256, 1280, 256, 2048)[i % 4], torch.float32, seed=40 + i)
                for i in range(8)]

    def worker(xp, h0, w, _):
        with torch.cuda.stream(torch.cuda.Stream()):
            for _ in range(10):
                y, _ = torch.ops.prnn.forward(xp, h0, w, None, "tanh")
            torch.cuda.current_stream().synchronize()
        ref = reference_forward(xp.double(), h0.double(), w.double(), None, "tanh")
        assert rel_err(y, ref) < 1e-5

    run_threads(worker, problems, timeout=120)


def test_bitwise_deterministic():
    xp, h0, w, lens = make_problem(100, 5, 1024, torch.bfloat16, lengths=True, seed=50)
    y1, h1 = torch.ops.prnn.forward(xp, h0, w, lens, "tanh")
    y2, h2 = torch.ops.prnn.forward(xp, h0, w, lens, "tanh")
    g = torch.randn_like(y1)
    b1 = torch.ops.prnn.backward(g, y1, h0, w, lens, "tanh")
    b2 = torch.ops.prnn.backward(g, y2, h0, w, lens, "tanh")
    assert torch.equal(y1, y2) and torch.equal(h1, h2)
    for a, b in zip(b1, b2):
        assert torch.equal(a, b)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_gpu():
    with torch.cuda.device(1):
        xp, h0, w, _ = make_problem(50, 4, 1024, torch.float32, seed=60)
    xp, h0, w = (t.to("cuda:1") for t in (xp, h0, w))
    y, _ = torch.ops.prnn.forward(xp, h0, w, None, "tanh")
    assert y.device == torch.device("cuda:1")
    assert rel_err(y, reference_forward(xp.double(), h0.double(), w.double(), None, "tanh")) < 1e-5
