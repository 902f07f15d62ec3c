"""``torch.compile(model, backend="kf")``: whole models through kf.

The backend is registered under the ``torch_dynamo_backends`` entry point (pyproject.toml),
so it works after ``pip install`` without importing kf first. Dynamo's graph goes through
AOTAutograd (functionalization, so mutation and aliasing are its business; the joint
graph cut by the min-cut partitioner, as Inductor does; backward ops decomposed with the
table kf's own autograd uses); kf then compiles the forward and the backward graph
(graphs.py): maximal regions of ops kf has become kf programs, kf-fuse making their
kernels, and the rest goes to Inductor or runs eagerly.

Options (``torch.compile(model, backend="kf", options={...})``):

- ``target``: ``cuda``, ``vulkan``, ``cpu`` or ``metal``; by default the fastest one for
  the graph's tensors: ``cuda`` for CUDA tensors, ``metal`` for MPS ones, and for CPU
  tensors ``vulkan`` where a Vulkan device is a GPU, else ``cpu`` (``best_target``).
- ``fallback``: ``inductor`` (default) or ``eager``: what runs the ops kf leaves.
- ``precision``: kf's precision option for every region (default ``auto``).
- ``attention``: how ``F.scaled_dot_product_attention`` runs (rewrites.py): ``kf`` (default)
  as kf's attention function, one op whose backward is kf's fused one; ``math`` as its
  ops, fused by kf-fuse with the ops around it.
- ``loss``: how ``cross_entropy(linear(h, W, b) [-> view/reshape/float], target)`` runs
  (rewrites.py): ``chunked`` (default) as kf's fused linear cross-entropy (kf.nn), in
  chunks of rows, never the whole logits; ``logits`` as its ops, the logits materialized.

``kf.explain(compiled_model, *inputs)`` reports what ran in kf and what fell back and why
(report.py); the same records go to the ``kf.backend`` logger (``KF_LOGS=backend``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

FALLBACKS = ("inductor", "eager")


@dataclass(frozen=True)
class BackendOptions:
    """The backend's options, checked: a typo is an error, not a silent default."""

    target: str
    fallback: str = "inductor"
    precision: str = "auto"
    attention: str = "kf"
    loss: str = "chunked"

    def kf_options(self):
        from ..options import Options

        return Options(target=self.target, precision=self.precision)


def best_target(device_type: str = "cpu") -> tuple[str, str]:
    """The fastest kf target for tensors of this device type, and why: CUDA tensors run on
    ``cuda``, MPS ones on ``metal``; CPU tensors on ``vulkan`` where the Vulkan device is
    a GPU, else on ``cpu`` (a Vulkan device that runs on the CPU, Mesa's lavapipe, is
    slower than kf's cpu target)."""
    if device_type == "cuda":
        return "cuda", f"a CUDA GPU is present ({torch.cuda.get_device_name()})"
    if device_type == "mps":
        return "metal", "an Apple GPU is present (torch.mps)"
    from kf.runtime import vulkan

    if vulkan.is_available():
        dev = vulkan.device()
        if dev.device_type != "CPU":
            return "vulkan", f"no CUDA GPU; Vulkan device {dev.name} is a GPU ({dev.device_type.lower()})"
        return "cpu", f"no GPU: the only Vulkan device, {dev.name}, runs on the CPU, slower than kf's cpu target"
    return "cpu", "no GPU and no Vulkan device"


def parse_options(options: dict | None, example_inputs) -> BackendOptions:
    from ..options import Options

    options = dict(options or {})
    unknown = sorted(set(options) - {"target", "fallback", "precision", "attention", "loss"})
    if unknown:
        raise ValueError(f"torch.compile(backend='kf'): unknown option(s) {', '.join(unknown)}; "
                         f"kf takes target, fallback, precision, attention and loss")
    if options.get("loss", "chunked") not in ("chunked", "logits"):
        raise ValueError(f"torch.compile(backend='kf'): loss must be 'chunked' or 'logits', "
                         f"got {options['loss']!r}")
    if options.get("attention", "kf") not in ("kf", "math"):
        raise ValueError(f"torch.compile(backend='kf'): attention must be 'kf' or 'math', "
                         f"got {options['attention']!r}")
    fallback = options.get("fallback", "inductor")
    if fallback not in FALLBACKS:
        raise ValueError(f"torch.compile(backend='kf'): fallback must be one of {', '.join(FALLBACKS)}, "
                         f"got {fallback!r}")
    target = options.get("target", "auto")
    if target == "auto":
        device = next((t.device.type for t in example_inputs if isinstance(t, torch.Tensor)), "cpu")
        target = best_target(device)[0]
    Options(target=target, precision=options.get("precision", "auto"))  # checks both
    return BackendOptions(target, fallback, options.get("precision", "auto"), options.get("attention", "kf"),
                          options.get("loss", "chunked"))


def kf_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, mode: str | None = None):
    """The Dynamo backend: AOTAutograd with kf compiling its forward and backward graphs.
    ``mode`` is accepted and not acted on: ``mode="reduce-overhead"`` (CUDA graphs) does
    not capture kf's launches yet, so it is logged and the graph runs as without it."""
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    from ..autograd import _decompositions
    from .graphs import compile_graph
    from .rewrites import attention, linear_cross_entropy

    from .. import logs

    logs.configure()  # KF_LOGS, where nothing of kf was imported before torch.compile found it
    opts = parse_options(options, example_inputs)
    if mode not in (None, "default"):
        logs.backend_log.info("torch.compile(mode=%r): kf runs the graph without it (no CUDA graphs yet)", mode)
    attention(gm, opts.attention, opts.kf_options())
    linear_cross_entropy(gm, opts.loss, opts.kf_options())
    kf_opts = _Resolved(opts)
    return aot_autograd(fw_compiler=partial(compile_graph, options=kf_opts, kind="forward"),
                        bw_compiler=partial(compile_graph, options=kf_opts, kind="backward"),
                        inference_compiler=partial(compile_graph, options=kf_opts, kind="inference"),
                        decompositions=_decompositions(),
                        partition_fn=min_cut_rematerialization_partition,
                        keep_inference_input_mutations=True)(gm, example_inputs)


class _Resolved:
    """What the graph compiler reads: kf's Options, the target and the fallback."""

    def __init__(self, opts: BackendOptions):
        self._kf = opts.kf_options()
        self.target = opts.target
        self.fallback = opts.fallback

    def __getattr__(self, name):
        return getattr(self._kf, name)


__all__ = ["BackendOptions", "best_target", "kf_backend", "parse_options"]
