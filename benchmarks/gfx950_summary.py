"""Every hand-written kernel's gfx950 (MI350) configs, cross-compiled here: registers, LDS, spills and
matrix instructions, as a markdown table (docs/kernels.md keeps the latest).

    PYTHONPATH=$PWD python benchmarks/gfx950_summary.py [--target gfx950] [--out FILE]

The specs are each kernel module's ``compile_specs`` (its representative shapes, with that arch's
configs where the module takes an arch), minus the ones named for another arch. Registers are the
``.vgpr_count`` (AMD) or registers per thread (NVIDIA); LDS is bytes of local data share / shared memory;
spills are scratch bytes plus VGPR spills (AMD), or stack beyond the PTX's own local arrays (NVIDIA).
"""
import argparse
import collections
import sys
import time

from flyarray.inspection import KERNEL_MODULES as MODULES, module_specs
from flyarray.targets import TARGETS, compile_for


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="gfx950", choices=sorted(TARGETS))
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args(argv)
    rows = ["| module | kernel config | warps | registers | LDS KiB | spills | matrix instructions |",
            "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    counts = collections.Counter()
    start = time.time()
    for module in MODULES:
        for spec in module_specs(module, args.target):
            try:
                r = compile_for(spec, args.target)
            except Exception as e:  # noqa: BLE001 - a row that says it failed, and the run goes on
                rows.append(f"| {module} | {spec.name} | {spec.num_warps} | - | - | - | FAILED: {type(e).__name__} |")
                counts["failed"] += 1
                continue
            matrix = ", ".join(sorted(set(r.matrix_instructions))) or "-"
            rows.append(f"| {module} | {spec.name} | {r.num_warps} | {r.registers} | {r.shared_bytes / 1024:.1f} | "
                        f"{r.spills} | {matrix} |")
            counts["spilling" if r.spills else "clean"] += 1
    table = "\n".join(rows)
    print(table)
    print(f"\n{sum(counts.values())} configs for {args.target}: {counts['clean']} without spills, "
          f"{counts['spilling']} spilling, {counts['failed']} failed to compile ({time.time() - start:.0f} s)")
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    return 1 if counts["spilling"] or counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
