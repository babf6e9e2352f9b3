"""fa.jit replay as one CUDA/HIP graph: every kernel of a traced function in a single launch.

A replayed plan costs one host launch per kernel (a few microseconds each); a captured graph replays
them all for one. A graph fixes every address it touches, which decides the rule:

- arguments are copied into the graph's own input buffers before each replay (the caller's tensors
  live anywhere), and results are copied out after it (the next replay rewrites the graph's output
  buffers, and a caller may still hold the previous results);
- so a graph pays off when the plan launches more kernels than the copies it adds: ``fa.jit``
  replays through a graph when the backend is ``gpu``, the plan makes more launches than
  (arguments copied in + outputs copied out + 1), and those copies move at most ``MAX_COPY_BYTES``;
- closed-over buffers and the trace's scalars are fixed for the trace's life anyway, so the graph
  reads them in place;
- a graph keeps the memory of every buffer its plan allocates for as long as the trace lives; above
  ``MAX_GRAPH_BYTES`` it is dropped and the trace launches as before;
- the capture happens on the first replay (the trace already compiled and ran every kernel once); if
  anything cannot be captured (a host synchronization in a library kernel) the trace falls back to
  plain launches for good, and ``FLYARRAY_LOG=1`` says why.

``fa.jit(f, cuda_graph=False)`` opts out, ``cuda_graph=True`` captures whatever the sizes (the
launch-count rule still decides nothing then), ``FLYARRAY_CUDA_GRAPHS=0`` turns graphs off (read at every
replay: a captured graph rests while it is off).
Replays of one graph are serialized (its buffers are shared); ``fa.stats()["graph_replays"]`` counts
them, and ``kernels_launched`` still counts the kernels each replay runs.
"""
from __future__ import annotations

import threading

import torch

from . import config, runtime

MAX_COPY_BYTES = 64 << 20  # above this the copies in and out cost more than the launches saved
MAX_GRAPH_BYTES = 1 << 30  # a graph keeps its intermediates' memory for the trace's life


def launches(program) -> int:
    """Kernel and library launches of a plan (allocations and view_as_real/view_as_complex are not launches)."""
    from .profiling import is_launch
    return sum(map(is_launch, program.description))


def worth_a_graph(program, arguments, out_slots, forced) -> bool:
    """The rule of the module docstring, for one trace's plan and the arguments it reads."""
    if program is None or forced is False or not config.cuda_graphs() or not arguments:
        return False
    device = arguments[0].device
    if device.type != "cuda" or not torch.cuda.is_available() or runtime.backend_for(device) != "gpu":
        return False
    if forced:
        return True
    copied = sum(t.numel() * t.element_size() for t in arguments)
    return launches(program) > len(arguments) + len(out_slots) + 1 and copied <= MAX_COPY_BYTES


class GraphedPlan:
    """A plan captured once over its own argument buffers; ``run`` copies in, replays, copies out."""

    def __init__(self, graph, static_args, out_tensors, n_launches):
        self.graph = graph
        self.static_args = static_args  # argument index -> the graph's own buffer for it
        self.out_tensors = out_tensors  # slot -> the graph's buffer for an output
        self.n_launches = n_launches
        self.lock = threading.Lock()
        runtime.free_after_fork(self)

    @classmethod
    def capture(cls, program, leaf_sources, tensors, scalars, out_slots):
        """Capture ``program`` reading private copies of its argument leaves and the closed-over
        buffers in place. Returns the graph, or None (and why) when it holds more than
        ``MAX_GRAPH_BYTES`` of intermediates; the caller then launches as before."""
        static_args = {src: tensors[src].clone() for src in leaf_sources if type(src) is int}
        leaves = [static_args[src] if type(src) is int else src for src in leaf_sources]
        launched = runtime._stats["kernels_launched"]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(tensors[0].device), torch.cuda.graph(graph):  # synchronizes first
            slots = program.run(leaves, scalars)
        runtime._stats["kernels_launched"] = launched  # captured, not run: replays count them
        held = sum(t.numel() * t.element_size() for t in slots if isinstance(t, torch.Tensor))
        if held > MAX_GRAPH_BYTES:
            return None, f"its buffers take {held >> 20} MiB (> {MAX_GRAPH_BYTES >> 20} MiB)"
        return cls(graph, static_args, {s: slots[s] for s in out_slots}, launches(program)), ""

    def run(self, tensors) -> dict:
        """This call's results: slot -> a tensor of the caller's own."""
        with self.lock:
            for index, static in self.static_args.items():
                static.copy_(tensors[index])
            self.graph.replay()
            runtime._stats["graph_replays"] += 1
            runtime._stats["kernels_launched"] += self.n_launches
            return {s: t.clone() for s, t in self.out_tensors.items()}
