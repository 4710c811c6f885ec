"""A model of gated_ffma.cu's index arithmetic, run on any machine: each value
of A (the forward's G x 8 gate rows, the backward's 8 unit columns) is held by
exactly one (warp, lane, row pair, column), and each exchanged word of each
live sequence is polled exactly once (poll_slice's slots and live_from), for
both cells and passes, KL 16-64, H 1 to 1024 and 1-8 live sequences. It
mirrors FfmaShape, load_rows and poll_slice; change it with them.

    python3 bench/lab/ffma_indices.py
"""
WARPS, UNITS = 8, 8


def shape(gates, backward, kl):
    rows = UNITS if backward else gates * UNITS
    row_lanes = rows // 2
    parts = 32 // row_lanes
    slice_width = parts * kl
    return rows, row_lanes, parts, slice_width, WARPS * slice_width


def held_values(gates, backward, kl):
    rows, row_lanes, parts, slice_width, extent = shape(gates, backward, kl)
    held = set()
    for warp in range(WARPS):
        for lane in range(32):
            rl, part = divmod(lane, parts)
            if rl >= row_lanes:
                continue
            for i in range(2):
                for j in range(kl // 4):
                    for e in range(4):
                        value = (rl + i * row_lanes, warp * slice_width + 4 * (parts * j + part) + e)
                        assert value not in held, value
                        held.add(value)
    assert len(held) == rows * extent, (gates, backward, kl)


def polled_words(gates, backward, kl, hidden, live):
    _, _, _, slice_width, extent = shape(gates, backward, kl)
    words = gates * 8 * -(-hidden // 8) if backward else 8 * -(-hidden // 8)
    if words > extent:
        return
    slots = 8 if kl < 64 else 4
    polled = set()
    for warp in range(WARPS):
        p, first = slice_width // 2, warp * slice_width
        pairs = min(slice_width, words - first) // 2
        if pairs <= 0:
            continue
        end = live * p

        def live_from(i):
            while i < end and i % p >= pairs:
                i += 32 * slots
            return i

        for lane in range(32):
            for j in range(slots):
                c = live_from(lane + 32 * j)
                while c < end:
                    n, r = divmod(c, p)
                    for word in (first + 2 * r, first + 2 * r + 1):
                        assert word < words and (n, word) not in polled, (n, word)
                        polled.add((n, word))
                    c = live_from(c + 32 * slots)
    assert len(polled) == live * words, (gates, backward, kl, hidden, live)


def main():
    for gates in (3, 4):
        for backward in (False, True):
            for kl in (16, 32, 64):
                held_values(gates, backward, kl)
                for hidden in (1, 7, 9, 200, 256, 257, 512, 513, 640, 1000, 1024):
                    for live in (1, 3, 8):
                        polled_words(gates, backward, kl, hidden, live)
    print("ffma indices: every value of A held once, every word polled once")


if __name__ == "__main__":
    main()
