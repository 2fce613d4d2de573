"""An independent, deliberately plain implementation of docs/model.md for the tests.

Loops over heads, one configuration at a time, no shared code with attnflow.
"""

import numpy as np

# Which j token i attends to under each mask, (n, n) booleans; one entry per declared mask (no default:
# tests/test_contract.py checks the names against attnflow's declarations).
MASK_RULES = {
    "none": lambda n: np.ones((n, n), dtype=bool),
    "causal": lambda n: np.tril(np.ones((n, n), dtype=bool)),
}


def _softmax(s, beta, keep, n):
    z = np.where(keep, beta * s, -np.inf)
    w = np.exp(z - np.max(z, axis=1, keepdims=True))
    return w / w.sum(axis=1, keepdims=True)


def _sigmoid(s, beta, keep, n):
    with np.errstate(over="ignore"):  # exp(+large) = inf: the weight's limit 1 / inf = 0, exactly
        return np.where(keep, 1.0 / (1.0 + np.exp(-(beta * s - np.log(n)))), 0.0)


# The weights w_ij of each attention type from the scores s (docs/model.md), and whether the head
# outputs are averaged (usa) or added (the others): one entry per declared type.
WEIGHTS = {
    "softmax": _softmax,
    "usa": lambda s, beta, keep, n: np.where(keep, np.exp(beta * s), 0.0),
    "sigmoid": _sigmoid,
    "relu": lambda s, beta, keep, n: np.where(keep, np.maximum(beta * s, 0.0) / n, 0.0),
}
AVERAGED = {"usa": True, "softmax": False, "relu": False, "sigmoid": False}


def _entry(table, name, what):
    if name not in table:
        raise NotImplementedError(f"reference: {what} {name!r} has no oracle here")
    return table[name]


def allowed(n, mask):
    """(n, n) booleans: which j token i attends to."""
    return _entry(MASK_RULES, mask, "mask")(n)


def head_outputs(x, score_matrices, beta, attention, values=None, mask="none"):
    """List of (weights, f^h) per head for one configuration x (n, d)."""
    n = x.shape[0]
    keep = allowed(n, mask)
    weights = _entry(WEIGHTS, attention, "attention")
    out = []
    for h, m in enumerate(score_matrices):
        v = m if values is None else values[h]
        s = x @ m @ x.T
        w = weights(s, beta, keep, n)
        out.append((w, w @ (x @ v.T)))
    return out


def velocity(x, score_matrices, beta, attention, spherical=True, values=None, mask="none"):
    n = x.shape[0]
    v = sum(f for _, f in head_outputs(x, score_matrices, beta, attention, values, mask))
    # docs/model.md: usa averages the head outputs, the others add them (head_outputs refuses others)
    if AVERAGED[attention]:
        v = v / n
    if spherical:
        v = v - np.sum(v * x, axis=1, keepdims=True) * x
    return v


def head_energies(x, score_matrices, beta):
    n = x.shape[0]
    return np.array([np.exp(beta * (x @ m @ x.T)).sum() / (2 * beta * n * n) for m in score_matrices])


def softplus_energies(x, score_matrices, beta):
    """Sigmoid attention's E_h = sum_ij softplus(beta s_ij - log n) / (2 beta n) (docs/model.md, result 8)."""
    n = x.shape[0]
    return np.array([np.logaddexp(0.0, beta * (x @ m @ x.T) - np.log(n)).sum() / (2 * beta * n)
                     for m in score_matrices])


def weight_entropies(x, score_matrices, beta, attention, mask="none"):
    """(H, n) entropies of each row of the weights, normalised to sum to 1."""
    rows = []
    for w, _ in head_outputs(x, score_matrices, beta, attention, mask=mask):
        p = w / w.sum(axis=1, keepdims=True)
        rows.append(-np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=1))
    return np.array(rows)


def entropies(x, score_matrices, beta):
    """(H, n) entropies of softmax_j(beta s_ij)."""
    rows = []
    for m in score_matrices:
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
