"""A neighbour for a benchmark run: a Python process churning memory part of the time, as
tandem's replayer does on the core beside an analysis vCPU (docs/benchmarks.md, "Why the
vCPU is slower per instruction": at 30% of a core beside the kasan kernel serving live,
its vCPU took 6.80 ns per guest instruction against 5.59 ns alone). Not a benchmark of
its own: start it beside one, e.g. with bench/offline_heavy.py's `live`.

Usage: python bench/neighbour.py [--duty 0.3] [--seconds 55]
"""
from __future__ import annotations

import argparse
import os
import time

BUFFERS, BUFFER_BYTES = 64, 1 << 20     # 64 MiB flipped a byte at a time
KEPT = 50_000                           # dict entries the slices are copied into
BURST_S = 0.001                         # busy this long, then asleep for the rest of the duty cycle


def churn(duty: float, seconds: float) -> int:
    """Busy `duty` of the time for `seconds`; the bytes flipped."""
    data = [bytearray(os.urandom(BUFFER_BYTES)) for _ in range(BUFFERS)]
    kept: dict[int, bytes] = {}
    end, i = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < BURST_S:
            b = data[i % BUFFERS]
            b[(i * 4097) % BUFFER_BYTES] ^= 1
            kept[i % KEPT] = bytes(b[:256])
            i += 1
        time.sleep(BURST_S * (1 - duty) / duty)
    return i


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duty", type=float, default=0.3, help="fraction of a core busy (0 < duty <= 1)")
    ap.add_argument("--seconds", type=float, default=55)
    args = ap.parse_args()
    if not 0 < args.duty <= 1:
        ap.error(f"--duty {args.duty}: must be in (0, 1]")
    print(f"neighbour: {churn(args.duty, args.seconds)} bytes flipped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
