"""Sharded arrays, collectives, shard_map, jit and grad over torch.distributed: 2 processes.

One job per device kind runs every check of tests/distributed_checks.py on both ranks (gloo on the
CPU; NCCL on 2 GPUs, skipped without them); each check is one test here, failing with the rank's
traceback. The job is launched once per module (about 5 s on the CPU).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from . import distributed_checks

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(device: str, out: str, nproc=2, only="") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
           "127.0.0.1", "--master-port", str(_free_port()), os.path.join(HERE, "distributed_checks.py"), "--out", out,
           "--device", device] + (["--only", only] if only else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the gloo job is the CPU path on any machine
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)


def _skip_reason(device):
    if not torch.distributed.is_available():
        return "torch.distributed is not available in this torch build"
    if device == "cpu" and not torch.distributed.is_gloo_available():
        return "torch.distributed has no gloo backend here"
    if device == "cuda" and (torch.cuda.device_count() < 2 or not torch.distributed.is_nccl_available()):
        return "needs 2 GPUs and NCCL"
    return None


@pytest.fixture(scope="module", params=["cpu", "cuda"])
def results(request, tmp_path_factory):
    """check name -> (rank 0's result, rank 1's result), from one 2-process job on this device kind."""
    reason = _skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    out = str(tmp_path_factory.mktemp(f"dist-{request.param}"))
    proc = _launch(request.param, out)
    ranks = []
    for r in range(2):
        path = os.path.join(out, f"rank{r}.json")
        if not os.path.exists(path):
            pytest.fail(f"rank {r} wrote no results (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                        f"{proc.stderr[-3000:]}")
        with open(path) as f:
            ranks.append(json.load(f))
    return {name: (ranks[0].get(name), ranks[1].get(name)) for name in distributed_checks.CHECKS}


@pytest.mark.parametrize("check", distributed_checks.CHECKS)
def test_distributed(results, check):
    for rank, outcome in enumerate(results[check]):
        if outcome and outcome.startswith("skip: "):
            pytest.skip(outcome[len("skip: "):])
        assert outcome == "ok", f"{check} on rank {rank}:\n{outcome}"


def test_two_by_two_mesh_on_four_processes(tmp_path):
    """Mesh(("dp", "tp"), (2, 2)): its row and column process groups exist only with 4 ranks (gloo)."""
    reason = _skip_reason("cpu")
    if reason:
        pytest.skip(reason)
    proc = _launch("cpu", str(tmp_path), nproc=4, only="check_mesh_2x2")
    for r in range(4):
        path = tmp_path / f"rank{r}.json"
        assert path.exists(), proc.stdout[-2000:] + proc.stderr[-3000:]
        outcome = json.loads(path.read_text())["check_mesh_2x2"]
        assert outcome == "ok", f"rank {r}:\n{outcome}"


def test_every_check_ran(results):
    assert all(None not in pair for pair in results.values()), \
        [name for name, pair in results.items() if None in pair]


def test_mesh_needs_a_process_group():
    """Without torch.distributed initialized, a Mesh says what to do (no job needed)."""
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    if torch.distributed.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    import flyarray as fa
    with pytest.raises(RuntimeError, match="init_process_group"):
        fa.sharding.Mesh(("x",), (1,))


def test_bad_mesh_arguments_fail_before_any_communication():
    import flyarray as fa
    for args, match in (((("x", "x"), (1, 1)), "distinct"), ((("x",), (1, 1)), "axis names"),
                        ((("a", "b", "c"), (1, 1, 1)), "1-D and 2-D"), ((("x",), (0,)), "positive")):
        with pytest.raises(ValueError, match=match):
            fa.sharding.Mesh(*args)


def test_partition_spec_rejects_bad_entries():
    import flyarray as fa
    with pytest.raises(TypeError, match="PartitionSpec entries"):
        fa.sharding.PartitionSpec(3)
    assert fa.ones(2).sharding is None


def test_docs_worked_example_runs_on_two_processes(tmp_path):
    """docs/distributed.md's launch example, as written, under torchrun: the gradient's global shape."""
    reason = _skip_reason("cpu")
    if reason:
        pytest.skip(reason)
    import re
    text = open(os.path.join(os.path.dirname(HERE), "docs", "distributed.md")).read()
    section = text[text.index("## Launching"):]
    script = tmp_path / "train.py"
    script.write_text(re.search(r"```python\n(.*?)```", section, re.S).group(1))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), str(script)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]),
               CUDA_VISIBLE_DEVICES="")  # the gloo path, whatever the machine
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "(32, 128)", proc.stdout


def test_bench_suite_runs_under_torchrun_and_only_rank_0_prints(tmp_path):
    reason = _skip_reason("cpu")
    if reason:
        pytest.skip(reason)
    report = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), "-m", "flyarray", "bench", "--suite", "distributed", "--small",
           "--json", str(report)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]),
               CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("ours/torch") == 1, proc.stdout  # one table: rank 0's
    rows = json.loads(report.read_text())["rows"]
    assert {r["status"] for r in rows} == {"ok"} and any(r["name"].startswith("TP MLP") for r in rows)
