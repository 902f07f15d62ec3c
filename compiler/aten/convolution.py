"""Convolution (``aten.convolution``: conv1d/2d/3d and their transposed forms) as one
matmul per call: the input, padded, is cut into one strided slice per kernel offset
(its patches, kernel size times its elements), and each group's weights, as a matrix,
multiply them. A transposed convolution is the ordinary one of the input with
stride - 1 zeros between its elements, padded by dilation * (kernel - 1) - padding
(plus output_padding after), with each group's weights swapped in and out and flipped."""

from __future__ import annotations

import itertools
import math

from kf.dialects import builders as kb

from .core import fake_value, handles, shape_of


def _pad(x, lo: list[int], hi: list[int], elem: str):
    """x with lo / hi elements of zeros before / after each spatial dim (negative: cut)."""
    for d, (a, b) in enumerate(zip(lo, hi)):
        dim = 2 + d
        n = shape_of(x)[dim]
        start, end = max(-a, 0), n - max(-b, 0)
        if (start, end) != (0, n):
            x = kb.slice(x, dim=dim, start=start, end=max(end, start), step=1)
        parts = []
        for amount, side in ((a, 0), (b, 1)):
            if amount > 0:
                shape = list(shape_of(x))
                shape[dim] = amount
                parts.append((side, kb.fill(shape, elem, 0.0)))
        if parts:
            before = [p for s, p in parts if s == 0]
            after = [p for s, p in parts if s == 1]
            x = kb.concat(before + [x] + after, dim=dim)
    return x


def _convolve(x, w, stride: list[int], dilation: list[int], groups: int, out: list[int]):
    """x (N, C, *S, padded) convolved with w (O, C / groups, *K): (N, O, *out)."""
    n, c = shape_of(x)[:2]
    o, cg = shape_of(w)[:2]
    ks = list(shape_of(w)[2:])
    p = math.prod(out)
    patches = []
    for k in itertools.product(*[range(s) for s in ks]):
        t = x
        for d, kd in enumerate(k):
            start = kd * dilation[d]
            t = kb.slice(t, dim=2 + d, start=start, end=start + (out[d] - 1) * stride[d] + 1, step=stride[d])
        patches.append(kb.reshape(t, [n, c, 1, p]))
    kp = len(patches)
    cols = kb.concat(patches, dim=2) if kp > 1 else patches[0]  # (N, C, Kp, P)
    cols = kb.reshape(cols, [n, groups, cg * kp, p])
    mat = kb.reshape(w, [groups, o // groups, cg * kp])
    r = kb.matmul(kb.broadcast_to(mat, [n, groups, o // groups, cg * kp]), cols)  # (N, g, O / g, P)
    return kb.reshape(r, [n, o] + list(out))


def _zeros_between(x, dim: int, s: int, elem: str):
    """s - 1 zeros after each element of x along dim but the last."""
    shape = list(shape_of(x))
    n = shape[dim]
    spread = kb.reshape(x, shape[:dim + 1] + [1] + shape[dim + 1:])
    zeros = kb.fill(shape[:dim + 1] + [s - 1] + shape[dim + 1:], elem, 0.0)
    joined = kb.concat([spread, zeros], dim=dim + 1)
    flat = kb.reshape(joined, shape[:dim] + [n * s] + shape[dim + 1:])
    return kb.slice(flat, dim=dim, start=0, end=(n - 1) * s + 1, step=1)


@handles("aten.convolution.default")
def _convolution(c, node, args, kwargs):
    x, w, bias, stride, padding, dilation, transposed, output_padding, groups = args[:9]
    elem = c.out_elem(node)
    x, w = c.tensor(x, elem), c.tensor(w, elem)
    out_shape = list(fake_value(node).shape)
    spatial = len(shape_of(x)) - 2
    stride, padding, dilation = ([v[0]] * spatial if len(v) == 1 else list(v) for v in (stride, padding, dilation))
    ks = list(shape_of(w)[2:])
    if transposed:
        output_padding = [output_padding[0]] * spatial if len(output_padding) == 1 else list(output_padding)
        for d in range(spatial):
            if stride[d] > 1 and shape_of(x)[2 + d] > 0:
                x = _zeros_between(x, 2 + d, stride[d], elem)
        edge = [dilation[d] * (ks[d] - 1) - padding[d] for d in range(spatial)]
        x = _pad(x, edge, [edge[d] + output_padding[d] for d in range(spatial)], elem)
        cin, og = shape_of(w)[:2]
        w = kb.reshape(w, [groups, cin // groups, og] + ks)
        w = kb.transpose(w, perm=[0, 2, 1] + list(range(3, 3 + spatial)))
        for d in range(spatial):
            if ks[d] > 1:
                backward = kb.sub(kb.scalar(float(ks[d] - 1), "i64"), kb.iota([ks[d]], 0, "i64"))
                w = kb.index_select(w, backward, dim=3 + d)
        w = kb.reshape(w, [groups * og, cin // groups] + ks)
        stride = [1] * spatial
    else:
        x = _pad(x, padding, padding, elem)
    r = _convolve(x, w, stride, dilation, groups, out_shape[2:])
    if bias is not None:
        r = kb.add(r, kb.reshape(c.tensor(bias, elem), [out_shape[1]] + [1] * spatial))
    return r
