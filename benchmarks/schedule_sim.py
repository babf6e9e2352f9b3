"""How much of a causal attention kernel's time the last wave wastes, by program order (no GPU).

A causal kernel's program over query block m (of n per (batch, head) slice) reads m + 1 key blocks, so
programs differ in length by up to n times. The GPU starts programs in grid order as slots free up
(greedy list scheduling), so the order decides how ragged the last wave is. This simulates that with
cost m + 1 + OVERHEAD per program and prints the efficiency (total work / slots / makespan) of:

  slice after slice   each slice's blocks heaviest first, slices one after another (the old order)
  grouped G           slices in groups of G: a group's heaviest blocks first, then the next ...
                      (attention.HEAD_GROUP; all slices at once is G = slices)

    python benchmarks/schedule_sim.py
"""
import heapq

OVERHEAD = 0.5  # a program's fixed cost (prologue, epilogue) in key blocks


def makespan(costs, slots: int) -> float:
    """Finish time of greedy list scheduling: each program starts on the first free slot, in order."""
    free = [0.0] * slots
    for c in costs:
        heapq.heappush(free, heapq.heappop(free) + c)
    return max(free)


def grouped(blocks: int, slices: int, group: int) -> list:
    order = []
    for first in range(0, slices, group):
        members = range(first, min(slices, first + group))
        order += [m + 1 + OVERHEAD for m in reversed(range(blocks)) for _ in members]
    return order


def main():
    cases = [("B2 H32 S2048, 64-row blocks, 2 programs an SM", 32, 64, 264),
             ("B2 H32 S2048, 128-row blocks, 1 program an SM", 16, 64, 132),
             ("B4 H32 S2048, 64-row blocks, 2 programs an SM", 32, 128, 264),
             ("B4 H32 S2048, 128-row blocks, 1 program an SM", 16, 128, 132),
             ("B8 H32 S4096, 128-row blocks, 1 program an SM", 32, 256, 132)]
    for name, blocks, slices, slots in cases:
        ideal = sum(grouped(blocks, slices, 1)) / slots
        cells = [f"slice after slice {ideal / makespan(grouped(blocks, slices, 1), slots):.3f}"]
        cells += [f"G{g} {ideal / makespan(grouped(blocks, slices, g), slots):.3f}" for g in (4, 8, 16, slices)]
        print(f"{name:48s} " + "  ".join(cells))


if __name__ == "__main__":
    main()
