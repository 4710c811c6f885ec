"""Is PersistentRNN / PersistentLSTM / PersistentGRU ever slower than the nn module
it replaces? Times ours against torch's module with the same (copied) weights, in
one process, eager calls, over cells x dtypes x batch x hidden x steps, and prints
the ratio torch / ours for each (> 1: ours is faster).

    python bench/sweep.py [--device cuda|cpu] [--cells rnn lstm gru]
                          [--dtypes float32 bfloat16 float16] [--batches 1 2 ... 1024]
                          [--hiddens 256 512 1024 2048] [--steps 16 64 256]
                          [--passes fwd fwdbwd] [--budget-s N] [--resume] [--out FILE]
    python bench/sweep.py --fixed-cost [--cells ...] [--dtypes ...] [--batches 16] [--hiddens 1024]
    python bench/sweep.py --packed [--seed 0] [--batches 16] [--hiddens 1024] [--steps 256]

Every axis defaults to the whole grid (on the CPU float32 only); input size =
hidden, one layer. Passes: "fwd" (under no_grad) and "fwdbwd" (the forward,
then the gradients of <output, a fixed random tensor> for the input and the
parameters). torch's module is recorded as impl "cudnn" on CUDA and "torch" on
the CPU, ours as "prnn" with the tier torch_prnn.plan says it runs ("tier",
and "backward_tier" for fwdbwd). torch's settings stay at their defaults, as a
user meets them (cuDNN may use TF32 for float32: torch.backends.cudnn.allow_tf32).

Each figure is the median of timings after two warm-up calls: CUDA events on
CUDA, perf_counter on the CPU (bench.py's time_ms); as many calls as make
about 0.2 s of the slower module's timed work, at least 3 and at most 200,
ours and torch's taking turns call by call (in alternating order), so that
a change of the machine's pace during the measurement hits both alike. Shapes whose training
step would not fit in memory are skipped. The shapes run level by level of a
grid refined coarse to fine (the smallest shape, the corners, then the
middles between), cheaper shapes first within a level, each shape for every
(cell, dtype) before the next, so a run stopped by
--budget-s (no measurement is started that would not fit in it) or
interrupted has covered every cell evenly; --resume skips what the output file
already holds for this device, so a sweep can run in several parts.

Records go to --out (default bench/results/sweep_<device>.json), merged with
those there (a record replaces the one of the same key), written after every
shape. Sweep and --packed records have bench.py's schema
{"impl", "cell", "dtype", "batch", "hidden", "input", "steps", "layers", "pass",
 "us_per_step", "device", "torch", "cuda", "date"}, --packed ones with
"packed": true for PackedSequence input (lengths uniform in T/4..T, from
--seed) and false for the same batch padded to T, both per padded step.
--fixed-cost times T = 1, 2, 4, ... 1024 and fits time = fixed + per_step * T,
minimising the relative residuals; its records have "fixed_us_per_call" and
"us_per_step" and no "steps".
"""
import argparse
import datetime
import itertools
import json
import os
import signal
import statistics
import sys
import time

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

# torch_prnn from this checkout when it is not installed (after the installed one on the path).
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_prnn  # noqa: E402
from bench import CELLS, DTYPES, initial_state, models, rel_err, time_ms  # noqa: E402

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
HIDDENS = (256, 512, 1024, 2048)
STEPS = (16, 64, 256)
FIXED_COST_STEPS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
PASSES = ("fwd", "fwdbwd")
GATES = {"rnn": 1, "lstm": 4, "gru": 3}
TARGET_S, MIN_REPS, MAX_REPS = 0.2, 3, 200
# What makes two records the same measurement (the rest is its value and provenance).
KEY = ("cell", "dtype", "batch", "hidden", "input", "steps", "layers", "pass", "packed", "device")


def reference_impl(device):
    return "cudnn" if device == "cuda" else "torch"


def key(record, impl=True):
    return ((record["impl"],) if impl else ()) + tuple(record.get(field) for field in KEY)


def ratios(records, value="us_per_step"):
    """[(ours, torch's, torch's value / ours)] for each record of ours that has a
    record of torch's module with the same key."""
    theirs = {key(r, impl=False): r for r in records if r["impl"] in ("cudnn", "torch")}
    return [(r, theirs[k], theirs[k][value] / r[value])
            for r in records if r["impl"] == "prnn" and (k := key(r, impl=False)) in theirs]


class Budget:
    """The wall-clock deadline, and the best throughput seen for each kind of
    call, from which a call not made yet is guessed (long for a shape larger
    than those seen: the costly case)."""

    def __init__(self, seconds):
        self.deadline = time.monotonic() + seconds
        self.rate = {}  # kind -> work per second
        self.skipped = 0

    def left(self):
        return self.deadline - time.monotonic()

    def guess(self, kind, work):
        """Seconds a call of this kind and work would take; 0 for a kind not seen yet."""
        rate = self.rate.get(kind)
        return 0.0 if rate is None else work / rate

    def fits(self, seconds):
        fits = seconds < self.left()
        self.skipped += not fits
        return fits

    def note(self, kind, work, seconds):
        self.rate[kind] = max(self.rate.get(kind, 0.0), work / seconds)


def measure_ms(fns, device, budget, kinds, work):
    """{name: median time of fn() in ms} of fns ({name: fn}), after two
    warm-up calls of each, the second timed to choose the number of calls;
    the fns take turns call by call, in alternating order, so that the
    host's and the GPU's changes of pace in a run (eager calls host-bound
    by cuDNN's per-step launches moved +-40% between two back-to-back
    medians of the same module on the H200: bench/NOTES.md step 46) hit
    them alike. None when they would not fit in the budget."""
    if not budget.fits((MIN_REPS + 2) * sum(budget.guess(kinds[name], work) for name in fns)):
        return None
    once = {}
    for name, fn in fns.items():
        fn()  # the first call: allocations, cuDNN's plan
        once[name] = max(time_ms(fn, device), 1e-3)  # a clock tick at least: it divides
        budget.note(kinds[name], work, once[name] / 1000)
    reps = max(MIN_REPS, min(MAX_REPS, int(1000 * TARGET_S / max(once.values()))))
    if not budget.fits(reps * sum(once.values()) / 1000):
        return None
    if device != "cpu":
        torch.cuda.synchronize()
    times = {name: [] for name in fns}
    names = list(fns)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            times[name].append(time_ms(fns[name], device))
    return {name: statistics.median(ts) for name, ts in times.items()}


def make_call(model, x, hx, leaf, grad_y, pass_name):
    """fn() of one pass: the forward under no_grad, or the forward then the
    gradients of <output, grad_y> for leaf (the input's data) and the parameters."""
    if pass_name == "fwd":
        def forward():
            with torch.no_grad():
                model(x, hx)
        return forward
    inputs = [leaf, *model.parameters()]

    def forward_backward():
        y = model(x, hx)[0]
        torch.autograd.grad(y.data if isinstance(y, PackedSequence) else y, inputs, grad_y)
    return forward_backward


def time_calls(impls, x, hx, leaf, grad_y, passes, device, budget, kind, work):
    """{(impl, pass): ms per call} of each module in impls ({impl: model}) on x,
    the modules taking turns (measure_ms); a pass is left out unless every
    impl was measured."""
    times = {}
    for pass_name in passes:
        fns = {impl: make_call(model, x, hx, leaf, grad_y, pass_name) for impl, model in impls.items()}
        row = measure_ms(fns, device, budget, {impl: (impl, pass_name) + kind for impl in impls}, work)
        if row is not None:
            times.update({(impl, pass_name): ms for impl, ms in row.items()})
    return times


def setup(cell, dtype_name, batch, hidden, steps, device):
    """{impl: model} (ours and torch's with the same weights), an input that
    wants its gradient, hx, and the gradient of the output."""
    dtype = DTYPES[dtype_name]
    torch.manual_seed(0)
    ref, ours = models(hidden, dtype, cell, device)
    x = torch.randn(steps, batch, hidden, device=device, dtype=dtype, requires_grad=True)
    hx = initial_state(cell, batch, hidden, dtype, device)
    grad_y = torch.randn(steps, batch, hidden, device=device, dtype=dtype)
    return {"prnn": ours, reference_impl(device): ref}, x, hx, grad_y


def tiers(cell, dtype_name, batch, hidden, steps, device, pass_name, lengths=False):
    """What plan says ours runs: {"tier"}, and {"backward_tier"} for fwdbwd."""
    def tier(backward):
        return torch_prnn.plan(hidden, batch=batch, steps=steps, dtype=DTYPES[dtype_name], device=device,
                               cell=cell, backward=backward, lengths=lengths)["tier"]
    return {"tier": tier(False), **({"backward_tier": tier(True)} if pass_name == "fwdbwd" else {})}


def record(impl, cell, dtype_name, batch, hidden, steps, pass_name, ms, meta, **extra):
    return {"impl": impl, "cell": CELLS[cell][3], "dtype": dtype_name, "batch": batch, "hidden": hidden,
            "input": hidden, "steps": steps, "layers": 1, "pass": pass_name, "us_per_step": round(1000 * ms / steps, 4),
            **extra, **meta}


def fits_memory(cell, dtype_name, batch, hidden, steps, device):
    """Whether a training step likely fits: about 3 x gates + 6 tensors of
    [T, B, H] (input, outputs, saved gates, their gradients, cuDNN's reserve)
    within 80% of the free memory."""
    need = (3 * GATES[cell] + 6) * steps * batch * hidden * DTYPES[dtype_name].itemsize
    if device == "cuda":
        free = torch.cuda.mem_get_info()[0]
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return need < 0.8 * free


def spread(values):
    """values, sorted, coarse to fine: the first, the last, then the middle of
    each gap between those taken, gap by gap."""
    values = sorted(values)
    order, gaps = [0, len(values) - 1], [(0, len(values) - 1)]
    while gaps:
        wider = [(lo, hi) for lo, hi in gaps if hi - lo > 1]
        order += [(lo + hi) // 2 for lo, hi in wider]
        gaps = [gap for lo, hi in wider for gap in ((lo, (lo + hi) // 2), ((lo + hi) // 2, hi))]
    return [values[i] for i in dict.fromkeys(order)]


def sweep_order(groups, batches, hiddens, steps):
    """[(group, B, H, T)]: level k of the grid (every value among the first k + 1
    of its axis's spread) before level k + 1; within a level the cheaper shapes
    (B H^2 T) first, each for every group in turn."""
    rank = [{v: i for i, v in enumerate(spread(axis))} for axis in (batches, hiddens, steps)]
    items = []
    for g, group in enumerate(groups):
        for b, h, t in itertools.product(batches, hiddens, steps):
            ranks = (rank[0][b], rank[1][h], rank[2][t])
            items.append(((max(ranks), b * h * h * t, ranks, g), (group, b, h, t)))
    return [item for _, item in sorted(items)]


def label(cell, dtype_name, batch, hidden, steps):
    return f"{cell:4s} {dtype_name:8s} B={batch:4d} H={hidden:4d} T={steps:4d}"


def time_shape(cell, dtype_name, batch, hidden, steps, passes, device, budget):
    """{(impl, pass): ms per call} of ours and torch's module on one shape, and
    the relative error of our output's last step (where a wrong weight or
    state shows most); ({}, None) when not even its shortest measurement would
    fit in the budget (before the set-up and first calls, not cheap either)."""
    work = steps * batch * hidden * hidden
    kinds = [(impl, p, cell, dtype_name) for impl in ("prnn", reference_impl(device)) for p in passes]
    if not budget.fits((MIN_REPS + 2) * min(budget.guess(kind, work) for kind in kinds)):
        return {}, None
    impls, x, hx, grad_y = setup(cell, dtype_name, batch, hidden, steps, device)
    with torch.no_grad():
        err = rel_err(impls["prnn"](x, hx)[0][-1], impls[reference_impl(device)](x, hx)[0][-1])
    return time_calls(impls, x, hx, x, grad_y, passes, device, budget, (cell, dtype_name), work), err


def measure_shape(cell, dtype_name, batch, hidden, steps, passes, device, budget):
    """time_shape's answer, or ({}, None) with a line saying why not: the shape
    would not fit in memory, or a call failed (the other shapes still run)."""
    shape = label(cell, dtype_name, batch, hidden, steps)
    result = {}, None
    if not fits_memory(cell, dtype_name, batch, hidden, steps, device):
        print(f"{shape}: skipped, it would not fit in memory", flush=True)
    else:
        try:
            result = time_shape(cell, dtype_name, batch, hidden, steps, passes, device, budget)
        except RuntimeError as e:  # torch.OutOfMemoryError among them
            print(f"{shape}: failed: {str(e).splitlines()[0]}", flush=True)
    if device == "cuda":  # time_shape's tensors are gone: mem_get_info sees the next shape's room
        torch.cuda.empty_cache()
    return result


def run_sweep(args, meta, results, budget):
    ref_impl = reference_impl(args.device)
    groups = [(cell, dtype_name) for cell in args.cells for dtype_name in args.dtypes]
    order = sweep_order(groups, args.batches, args.hiddens, args.steps)
    for done, ((cell, dtype_name), batch, hidden, steps) in enumerate(order):
        if budget.left() <= 0:
            print(f"--budget-s reached: {len(order) - done} of {len(order)} shapes not run", flush=True)
            break
        shape = (cell, dtype_name, batch, hidden, steps)
        passes = [p for p in args.passes if not (args.resume and all(
            key(record(impl, *shape, p, 0, meta)) in results.previous for impl in ("prnn", ref_impl)))]
        if not passes:
            continue
        times, err = measure_shape(*shape, passes, args.device, budget)
        new = [record(impl, *shape, p, ms, meta, **(tiers(*shape, args.device, p) if impl == "prnn" else {}))
               for (impl, p), ms in times.items()]
        results.add(new)
        for ours, theirs, ratio in ratios(new):
            print(f"{label(*shape)} {ours['pass']:6s} prnn {ours['us_per_step']:9.2f} {ref_impl} "
                  f"{theirs['us_per_step']:9.2f} us/step  ratio {ratio:5.2f}  {ours['tier']}  err {err:.1e}",
                  flush=True)


def print_worst(records):
    """The worst ratio torch / ours of each (cell, dtype, pass) among records."""
    worst, count, below = {}, {}, {}
    for ours, _, ratio in ratios(records):
        group = (ours["cell"], ours["dtype"], ours["pass"])
        count[group] = count.get(group, 0) + 1
        below[group] = below.get(group, 0) + (ratio < 1)
        if group not in worst or ratio < worst[group][1]:
            worst[group] = (ours, ratio)
    if not worst:
        return
    print(f"\nworst ratio torch / ours (> 1: ours faster) per cell, and how many of the shapes are below 1\n"
          f"{'cell':8s} {'dtype':8s} {'pass':6s} {'worst':>6s} {'B':>5s} {'H':>5s} {'T':>4s} {'below 1':>8s}  tier")
    for group in sorted(worst):
        ours, ratio = worst[group]
        print(f"{group[0]:8s} {group[1]:8s} {group[2]:6s} {ratio:6.2f} {ours['batch']:5d} {ours['hidden']:5d} "
              f"{ours['steps']:4d} {below[group]:4d}/{count[group]:<3d}  {ours['tier']}")


def fit_line(points):
    """(intercept, slope) of the line through {x: y} minimising the squared
    relative residuals: with plain least squares the noise of the long calls
    would swamp the intercept, which the short calls measure."""
    w = {x: 1 / y ** 2 for x, y in points.items()}
    sw, sx = sum(w.values()), sum(w[x] * x for x in points)
    sy, sxx = sum(w[x] * y for x, y in points.items()), sum(w[x] * x * x for x in points)
    sxy = sum(w[x] * x * y for x, y in points.items())
    slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    return (sy - slope * sx) / sw, slope


def fixed_cost_record(impl, cell, dtype_name, batch, hidden, pass_name, points, meta):
    """The line through {steps: ms per call}: fixed µs per call, µs per step,
    and the largest relative residual (how straight the line is)."""
    fixed, per_step = fit_line(points)
    residual = max(abs(ms - fixed - per_step * steps) / ms for steps, ms in points.items())
    return {"impl": impl, "cell": CELLS[cell][3], "dtype": dtype_name, "batch": batch, "hidden": hidden,
            "pass": pass_name, "fixed_us_per_call": round(1000 * fixed, 2), "us_per_step": round(1000 * per_step, 4),
            "fit_steps": sorted(points), "fit_max_rel_residual": round(residual, 4), **meta}


def run_fixed_cost(args, meta, results, budget):
    ref_impl = reference_impl(args.device)
    for cell, dtype_name, batch, hidden in itertools.product(args.cells, args.dtypes, args.batches, args.hiddens):
        points = {}  # (impl, pass) -> {steps: ms per call}
        for steps in args.steps:
            times, _ = measure_shape(cell, dtype_name, batch, hidden, steps, args.passes, args.device, budget)
            for (impl, pass_name), ms in times.items():
                points.setdefault((impl, pass_name), {})[steps] = ms
        new = [fixed_cost_record(impl, cell, dtype_name, batch, hidden, pass_name, p, meta)
               for (impl, pass_name), p in points.items() if len(p) >= 2]
        results.add(new)
        for ours, theirs, ratio in ratios(new, "fixed_us_per_call"):
            steps = ours["fit_steps"]
            residual = max(ours["fit_max_rel_residual"], theirs["fit_max_rel_residual"])
            print(f"{cell:4s} {dtype_name:8s} B={batch:4d} H={hidden:4d} {ours['pass']:6s} fixed us/call: prnn "
                  f"{ours['fixed_us_per_call']:8.1f} {ref_impl} {theirs['fixed_us_per_call']:8.1f} ratio {ratio:5.2f}"
                  f" | us/step: prnn {ours['us_per_step']:8.3f} {ref_impl} {theirs['us_per_step']:8.3f} ratio "
                  f"{theirs['us_per_step'] / ours['us_per_step']:5.2f} | T {steps[0]}..{steps[-1]}, worst residual "
                  f"{residual:.0%}", flush=True)


def packed_batch(x, lengths):
    """x [T, B, H] with zeros past each length (as pad_sequence makes it),
    wanting its gradient, and the same batch as a PackedSequence whose data is
    a leaf of its own (packing is the caller's work, not timed)."""
    valid = (torch.arange(len(x)).unsqueeze(1) < lengths).to(x.device).unsqueeze(2)
    padded = (x.detach() * valid).requires_grad_()
    packed = pack_padded_sequence(padded.detach(), lengths, enforce_sorted=False)
    return padded, PackedSequence(packed.data.requires_grad_(), *packed[1:])


def run_packed(args, meta, results, budget):
    ref_impl = reference_impl(args.device)
    for shape in itertools.product(args.cells, args.dtypes, args.batches, args.hiddens, args.steps):
        cell, dtype_name, batch, hidden, steps = shape
        lengths = torch.randint(steps // 4, steps + 1, (batch,), generator=torch.Generator().manual_seed(args.seed))
        impls, x, hx, grad_y = setup(*shape, args.device)
        padded, packed = packed_batch(x, lengths)
        new = []
        for is_packed, inp, leaf, grad in ((True, packed, packed.data, grad_y.flatten(0, 1)[:len(packed.data)]),
                                           (False, padded, padded, grad_y)):
            times = time_calls(impls, inp, hx, leaf, grad, args.passes, args.device, budget,
                               (cell, dtype_name, is_packed), steps * batch * hidden * hidden)
            extra = {"packed": is_packed, "lengths_seed": args.seed,
                     "mean_length": round(lengths.float().mean().item(), 1)}
            new += [record(impl, *shape, p, ms, meta, **extra,
                           **(tiers(*shape, args.device, p, lengths=is_packed) if impl == "prnn" else {}))
                    for (impl, p), ms in times.items()]
        results.add(new)
        us = {(ours["pass"], ours["packed"]): (ours["us_per_step"], theirs["us_per_step"])
              for ours, theirs, _ in ratios(new)}
        for pass_name in args.passes:
            if (pass_name, True) in us and (pass_name, False) in us:
                (ours, theirs), (ours_padded, theirs_padded) = us[(pass_name, True)], us[(pass_name, False)]
                print(f"{label(*shape)} {pass_name:6s} us/padded step, packed: prnn {ours:8.2f} {ref_impl} "
                      f"{theirs:8.2f} ratio {theirs / ours:5.2f} | padded: prnn {ours_padded:8.2f} {ref_impl} "
                      f"{theirs_padded:8.2f} ratio {theirs_padded / ours_padded:5.2f} | padded / packed: prnn "
                      f"{ours_padded / ours:5.2f} {ref_impl} {theirs_padded / theirs:5.2f}", flush=True)


class Results:
    """This run's records, merged into those already in the file (a record
    replaces the one of the same key) and written after every shape, so a
    run cut short keeps what it measured."""

    def __init__(self, path):
        self.path, self.records = path, []
        kept = []
        if os.path.exists(path):
            with open(path) as f:
                kept = json.load(f)
        self.previous = {key(r): r for r in kept}

    def merged(self):
        return list({**self.previous, **{key(r): r for r in self.records}}.values())

    def add(self, new):
        self.records += new
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path + ".tmp", "w") as f:  # then renamed: a kill mid-write keeps the old file
            json.dump(self.merged(), f, indent=1)
        os.replace(self.path + ".tmp", self.path)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--cells", nargs="+", choices=list(CELLS), default=list(CELLS))
    ap.add_argument("--dtypes", nargs="+", choices=list(DTYPES))
    ap.add_argument("--batches", nargs="+", type=int)
    ap.add_argument("--hiddens", nargs="+", type=int)
    ap.add_argument("--steps", nargs="+", type=int)
    ap.add_argument("--passes", nargs="+", choices=PASSES, default=list(PASSES))
    ap.add_argument("--budget-s", type=float, default=float("inf"),
                    help="start no measurement that would end later than this many seconds after the start")
    ap.add_argument("--resume", action="store_true", help="sweep: skip the shapes --out already holds for this device")
    ap.add_argument("--out", help="default: bench/results/sweep_<device>.json")
    ap.add_argument("--threads", type=int, help="torch's CPU threads (default: torch's)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--fixed-cost", action="store_true", help="fit fixed + per_step * T over T = 1 .. 1024")
    mode.add_argument("--packed", action="store_true", help="PackedSequence input against the same batch padded")
    ap.add_argument("--seed", type=int, default=0, help="--packed: the seed of the lengths")
    args = ap.parse_args(argv)
    # The defaults of each mode: the sweep's whole grid, or one shape at the T that mode needs.
    one_shape = {"batches": [16], "hiddens": [1024], "dtypes": ["float32"]}
    defaults = {"batches": list(BATCHES), "hiddens": list(HIDDENS), "steps": list(STEPS),
                "dtypes": list(DTYPES) if args.device == "cuda" else ["float32"]}
    if args.fixed_cost:
        defaults.update(one_shape, steps=list(FIXED_COST_STEPS))
    elif args.packed:
        defaults.update(one_shape, steps=[256])
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.device == "cpu" and args.dtypes != ["float32"]:
        ap.error("the CPU path runs float32 only")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device (--device cpu runs on the CPU)")
    return args


def main(argv=None):
    args = parse_args(argv)
    budget = Budget(args.budget_s)
    if args.threads:
        torch.set_num_threads(args.threads)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    meta = {"device": device_name, "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": datetime.date.today().isoformat()}
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   f"sweep_{device_name.replace(' ', '_')}.json")
    results = Results(out)
    threads = f", {torch.get_num_threads()} threads" if args.device == "cpu" else ""
    seed = f", lengths seed {args.seed}" if args.packed else ""
    print(f"{device_name}, torch {torch.__version__}{threads}{seed}; "
          f"ratio = {reference_impl(args.device)} / prnn (> 1: ours faster)", flush=True)
    try:
        (run_fixed_cost if args.fixed_cost else run_packed if args.packed else run_sweep)(args, meta, results, budget)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    if budget.skipped:
        print(f"{budget.skipped} measurements or shapes left out: they would have run past --budget-s")
    if not (args.fixed_cost or args.packed):  # a resumed sweep's summary takes in the parts before
        shown = results.merged() if args.resume else results.records
        print_worst([r for r in shown if r["device"] == device_name and "steps" in r and "packed" not in r])
    print(f"{len(results.records)} records written to {out}")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a timeout's TERM ends the run as Ctrl-C does
    main()
