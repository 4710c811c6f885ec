"""The resident stream's step() latency against an idle gap before each step
and against the number of CTAs it holds (bench/NOTES.md step 71): a step
right after the last one meets the recurrent product the kernel runs after
each answer; fewer CTAs make cheaper barriers but longer products.

    python3 bench/lab/stream_gap.py

PersistentRNN, B = 1, step(x, out=), 3000 steps after 200; p50 / p99 in µs.
Nothing launches a CUDA kernel while a stream is open (torch_prnn.Stream's
documentation: a first launch would wait for the GPU to idle).
"""
import time

import torch

import torch_prnn

clock = time.perf_counter_ns


def run(dtype, batch, hidden, gap_us, steps=3000, max_sms=None):
    torch.manual_seed(0)
    rnn = torch_prnn.PersistentRNN(hidden, hidden, device="cuda", dtype=dtype)
    x, out = torch.randn(batch, hidden, dtype=dtype), torch.empty(batch, hidden, dtype=dtype)
    with torch_prnn.Stream(rnn, batch=batch, max_sms=max_sms) as stream:
        for _ in range(200):
            stream.step(x, out=out)
        times = []
        for _ in range(steps):
            if gap_us:
                until = clock() + gap_us * 1000
                while clock() < until:
                    pass
            start = clock()
            stream.step(x, out=out)
            times.append(clock() - start)
        sms = stream.sms
    times.sort()
    return times[steps // 2] / 1e3, times[int(steps * 0.99)] / 1e3, sms


def main():
    print("dtype     H     gap_us  p50    p99    sms  max_sms")
    cases = [(dtype, hidden, gap, None) for dtype in (torch.float32, torch.bfloat16) for hidden in (256, 1024)
             for gap in (0, 5, 20, 60)]
    cases += [(dtype, 1024, gap, sms) for dtype, sms in ((torch.float32, 40), (torch.float32, 64),
                                                         (torch.bfloat16, 20), (torch.bfloat16, 32))
              for gap in (0, 20)]
    for dtype, hidden, gap, max_sms in cases:
        p50, p99, sms = run(dtype, 1, hidden, gap, max_sms=max_sms)
        print(f"{str(dtype)[6:]:9} {hidden:5} {gap:6}  {p50:6.2f} {p99:6.2f} {sms:4}  {max_sms or '-'}")


if __name__ == "__main__":
    main()
