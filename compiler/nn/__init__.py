"""kf's fused layers, called like ``torch.nn.functional``'s.

    import kf.nn
    loss = kf.nn.fused_linear_cross_entropy(hidden, lm_head.weight, target)

``fused_linear_cross_entropy`` (linear_cross_entropy.py) is ``F.cross_entropy(F.linear(hidden,
weight, bias), target)`` computed in chunks of rows, so that the vocabulary-sized logits
never exist whole; ``torch.compile(backend="kf")`` puts it in place of that pattern itself.
"""

from .linear_cross_entropy import ChunkPlan, fused_linear_cross_entropy, plan_chunks

__all__ = ["ChunkPlan", "fused_linear_cross_entropy", "plan_chunks"]
