"""An independent, deliberately plain implementation of MODEL.md for the tests.

Loops over heads, one configuration at a time, no shared code with attnflow.
"""

import numpy as np


def head_outputs(x, scores, beta, attention, values=None):
    """List of (weights, f^h) per head for one configuration x (n, d)."""
    n = x.shape[0]
    out = []
    for h, m in enumerate(scores):
        v = m if values is None else values[h]
        s = x @ m @ x.T
        if attention == "softmax":
            w = np.exp(beta * s - np.max(beta * s, axis=1, keepdims=True))
            w = w / w.sum(axis=1, keepdims=True)
        elif attention == "usa":
            w = np.exp(beta * s)
        else:
            w = np.maximum(beta * s, 0.0) / n
        out.append((w, w @ (x @ v.T)))
    return out


def velocity(x, scores, beta, attention, spherical=True, values=None):
    n = x.shape[0]
    v = sum(f for _, f in head_outputs(x, scores, beta, attention, values))
    if attention == "usa":
        v = v / n
    if spherical:
        v = v - np.sum(v * x, axis=1, keepdims=True) * x
    return v


def head_energies(x, scores, beta):
    n = x.shape[0]
    return np.array([np.exp(beta * (x @ m @ x.T)).sum() / (2 * beta * n * n) for m in scores])


def entropies(x, scores, beta):
    """(H, n) entropies of softmax_j(beta s_ij)."""
    rows = []
    for m in scores:
        z = beta * (x @ m @ x.T)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        rows.append(-np.sum(p * np.log(p), axis=1))
    return np.array(rows)


def random_symmetric(rng, H, d, scale=1.0):
    g = rng.standard_normal((H, d, d))
    return scale * (g + np.swapaxes(g, 1, 2)) / (2 * np.sqrt(d))


def random_sphere(rng, n, d):
    x = rng.standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)
