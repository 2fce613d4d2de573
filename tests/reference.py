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


def _tangent(u, theta):
    return u - np.sum(u * theta, axis=1, keepdims=True) * theta


def _norms(a):
    return np.linalg.norm(a, axis=1, keepdims=True)


# docs/model.md, result 12: dx_k/dt from the attention velocity u_k (read at the directions theta_k) and
# the radii r_k, and the speed s_k with dtheta_k/dt = s_k P(u_k), per geometry (one entry per declared
# geometry: tests/test_contract.py); flat is no sphere flow (no speed).
MOTIONS = {
    "sphere": lambda u, theta, r, alpha: _tangent(u, theta),
    "flat": lambda u, theta, r, alpha: u,
    "pre_ln": lambda u, theta, r, alpha: u,
    "peri_ln": lambda u, theta, r, alpha: u / _norms(u),
    "ngpt": lambda u, theta, r, alpha: alpha * _tangent(u, theta) / _norms(u),
}
SPEEDS = {
    "sphere": lambda u, r, alpha: np.ones_like(r),
    "pre_ln": lambda u, r, alpha: 1.0 / r,
    "peri_ln": lambda u, r, alpha: 1.0 / (r * _norms(u)),
    "ngpt": lambda u, r, alpha: alpha / _norms(u),
}
RADII = {"pre_ln", "peri_ln"}  # the geometries whose state carries radii


def attention_velocity(x, score_matrices, beta, attention, values=None, mask="none"):
    """u_i = sum_h f^h_i ((1/n) sum_h for usa) at the configuration x."""
    n = x.shape[0]
    v = sum(f for _, f in head_outputs(x, score_matrices, beta, attention, values, mask))
    # docs/model.md: usa averages the head outputs, the others add them (head_outputs refuses others)
    if AVERAGED[attention]:
        v = v / n
    return v


def velocity(x, score_matrices, beta, attention, geometry="sphere", values=None, mask="none", alpha=1.0):
    """dx/dt; where the geometry carries radii, x = r theta and attention reads theta."""
    r = _norms(x)
    theta = x / r if geometry in RADII else x
    u = attention_velocity(theta, score_matrices, beta, attention, values, mask)
    return _entry(MOTIONS, geometry, "geometry")(u, theta, r, alpha)


def direction_velocity(x, score_matrices, beta, attention, geometry, values=None, mask="none", alpha=1.0):
    """(theta, dtheta/dt, s) by the speed form of result 12: dtheta_k/dt = s_k P_{theta_k}(u_k)."""
    r = _norms(x)
    theta = x / r
    u = attention_velocity(theta, score_matrices, beta, attention, values, mask)
    s = _entry(SPEEDS, geometry, "geometry")(u, r, alpha)
    return theta, s * _tangent(u, theta), s[:, 0]


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
