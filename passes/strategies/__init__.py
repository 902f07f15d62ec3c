"""kf's kernel strategies: how each kind of fused kernel becomes a gpu.func.

``kf-fuse`` marks each kernel function with a kind (``kf.kernel``); ``kf-tile`` asks the
strategy of that kind for a plan (``kf.plan``); ``kf-map-to-gpu`` asks it to emit the
kernel. Strategies register by kind in ``STRATEGIES``; the ``generic`` strategy handles
every kernel that no specialized strategy takes.
"""
