"""Which earlier test makes a test fail when it runs after it in one pytest-xdist worker.

    FLYARRAY_TEST_ORDER_DIR=DIR pytest -n 16 ...      # records each worker's sequence (tests/conftest.py)
    python3 benchmarks/bisect_order.py DIR [TEST_ID ...] [--budget SECONDS]

For each failing test (the ids given, or every test a worker recorded as failed), takes the tests its worker
ran before it and replays them in one process (tests/conftest.py's FLYARRAY_TEST_SELECT), then narrows
them: the prefix cut in as many chunks as there are cores, each chunk run before the test in a process of
its own, the first chunk that makes it fail cut again, until one test is left (or none alone does: then the
complements are tried, ddmin's second step). Prints each round and the culprit.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import os
import subprocess
import sys
import tempfile
import time


def worker_sequences(order_dir: str) -> dict:
    """worker name -> [(outcome, when, test id)] in the order that worker reported them."""
    out = {}
    for name in sorted(os.listdir(order_dir)):
        if name.endswith(".txt") and name != "main.txt":
            with open(os.path.join(order_dir, name)) as f:
                out[name[:-4]] = [tuple(line.rstrip("\n").split("\t", 2)) for line in f if line.strip()]
    return out


def prefix_of(sequences: dict, test: str):
    """The ids the worker that failed ``test`` ran before it (each once, in order), or None."""
    for records in sequences.values():
        ids = [r[2] for r in records]
        if test in ids:
            before = ids[:ids.index(test)]
            return list(dict.fromkeys(t for t in before if t != test))
    return None


def fails(ids: list, test: str, timeout: float) -> bool:
    """Whether ``test`` fails when ``ids`` run before it in one fresh process."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(ids + [test]) + "\n")
        select = f.name
    files = list(dict.fromkeys(t.split("::")[0] for t in ids + [test]))
    env = dict(os.environ, FLYARRAY_TEST_SELECT=select)
    env.pop("FLYARRAY_TEST_ORDER_DIR", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *files]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    finally:
        os.unlink(select)
    return f"FAILED {test}" in done.stdout or (done.returncode == 1 and "1 failed" in done.stdout
                                               and test.split("::")[-1] in done.stdout)


def chunks(items: list, n: int) -> list:
    size = -(-len(items) // n)
    return [items[i:i + size] for i in range(0, len(items), size)]


def narrow(prefix: list, test: str, deadline: float, jobs: int, timeout: float) -> list:
    """The smallest run of ``prefix`` found that still makes ``test`` fail (ddmin, parallel rounds)."""
    while len(prefix) > 1 and time.time() < deadline:
        parts = chunks(prefix, min(jobs, len(prefix)))
        with futures.ThreadPoolExecutor(jobs) as pool:
            alone = list(pool.map(lambda p: fails(p, test, timeout), parts))
        print(f"  {len(prefix)} tests in {len(parts)} chunks: chunk fails alone {alone}", flush=True)
        if any(alone):
            prefix = parts[alone.index(True)]
            continue
        complements = [[t for q in parts if q is not p for t in q] for p in parts]
        with futures.ThreadPoolExecutor(jobs) as pool:
            without = list(pool.map(lambda p: fails(p, test, timeout), complements))
        print(f"  complements fail {without}", flush=True)
        if not any(without):
            print("  no chunk and no complement reproduces: needs several chunks together", flush=True)
            return prefix
        prefix = complements[without.index(True)]
    return prefix


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("order_dir")
    parser.add_argument("tests", nargs="*")
    parser.add_argument("--budget", type=float, default=240.0)
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--timeout", type=float, default=180.0)
    args = parser.parse_args()
    deadline = time.time() + args.budget
    sequences = worker_sequences(args.order_dir)
    tests = args.tests or list(dict.fromkeys(r[2] for rs in sequences.values() for r in rs if r[0] == "failed"))
    for test in tests:
        prefix = prefix_of(sequences, test)
        if prefix is None:
            print(f"{test}: no worker ran it", flush=True)
            continue
        print(f"{test}: {len(prefix)} tests ran before it in its worker", flush=True)
        if not fails(prefix, test, args.timeout):
            print("  the whole prefix replayed in one process: passes (not reproduced)", flush=True)
            continue
        culprit = narrow(prefix, test, deadline, args.jobs, args.timeout)
        print(f"  culprit ({len(culprit)} tests): {culprit[:10]}", flush=True)


if __name__ == "__main__":
    main()
