"""Approximate orthogonality (Thm 39): per-head monotonicity at a configuration, with and without an
overlap of the heads.

Thm 39 is a pointwise statement: at a configuration where exactly orthogonal heads are per-head
monotone, an overlap ``omega = max ||M_h' M_h||_op`` small against the heads' own terms keeps them
monotone. So the reduction evaluates, at every configuration a run visits up to ``T_eps`` (from
uniform random tokens), the per-head energy rates of usa twice, with the cell's perturbed heads
``M_h = lambda_h P_h + delta E_h`` and with its orthogonal part ``lambda_h P_h`` alone, on the sphere
and in flat space (a rate is a function of the configuration: the flat one needs no flat run, whose
usa tokens blow up within t ~ 0.03; a flat run's configurations are brought onto the sphere for the
sphere's rates).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from ..cell import MAX_EXPONENT
from ..pack import cell_values
from ..tokens import unit_rows
from . import Axis, Experiment, Spec
from ._common import SIGN_RTOL, before_cluster

GEOMETRIES = ("sphere", "flat")
# Critical overlaps are located at this many configurations per run (evenly spaced samples up to
# T_eps, t = 0 among them): each costs a root search, and neighbouring samples are near copies.
CRITICAL_PER_RUN = 8
# The search for the critical overlap scans s in (0, S_MAX lambda_max] (the perturbation M0 + s E):
# omega reaches about 2 S_MAX lambda^2 there, far beyond any overlap a grid asks about.
S_MAX = 4.0
SCAN = 48  # geometric scan points; then bisection to BISECT halvings of the bracket
BISECT = 30


def cross_norms(score_matrices: np.ndarray) -> np.ndarray:
    """``omega = max over head pairs of ||M_h' M_h||_op`` (Thm 39's overlap): score_matrices
    (..., H, d, d), the result (...)."""
    m = score_matrices
    H = m.shape[-3]
    worst = np.zeros(m.shape[:-3])
    for a in range(H):
        for b in range(a + 1, H):  # ||M_b M_a|| = ||(M_a M_b)^T|| for symmetric heads
            worst = np.maximum(worst, np.linalg.norm(m[..., a, :, :] @ m[..., b, :, :], 2, axis=(-2, -1)))
    return worst


def head_terms(x: np.ndarray, m: np.ndarray, beta: float, spherical: bool) -> dict[str, np.ndarray]:
    """The per-head terms of usa's energy rates at one configuration (Thm 16-17, value alignment).

    x (..., n, d) unit rows; m (..., H, d, d) symmetric. With ``u^h_i = sum_j exp(beta s^h_ij) x_j``
    and ``f^h_i = M_h u^h_i``, ``n^3 dE_h/dt = margin_h + cross_h``: on the sphere
    ``margin_h = sum_i [T^h_i - a^h_i sum_{h'!=h} a^h'_i]`` (the recorded Radial Dominance margins),
    in flat space ``sum_i ||f^h_i||^2``; ``cross_h = sum_i sum_{h'!=h} <f^h'_i, f^h_i>``, which
    vanishes for orthogonal heads and is at most ``omega * bound_h`` with the actual
    ``bound_h = sum_i |u^h_i| sum_{h'!=h} |u^h'_i|``. ``scale_h``, the sum of the terms' sizes, is
    the round-off scale a rate's sign is judged against. Every result (..., H).
    """
    scores = np.einsum("...id,...hde,...je->...hij", x, m, x)
    u = np.einsum("...hij,...jd->...hid", np.exp(beta * scores), x)
    f = np.einsum("...hde,...hie->...hid", m, u)
    gram = np.einsum("...hid,...kid->...hki", f, f)  # <f^h_i, f^k_i>: (..., H, H, n)
    own = np.einsum("...hhi->...hi", gram)
    off = gram.sum(-2) - own  # sum_{h' != h} <f^h'_i, f^h_i>
    size = abs(gram).sum(-2)
    u_norm = np.linalg.norm(u, axis=-1)
    bound = (u_norm * (u_norm.sum(-2, keepdims=True) - u_norm)).sum(-1)
    if spherical:
        a = np.einsum("...hid,...id->...hi", f, x)
        others = a.sum(-2, keepdims=True) - a
        margin = (own - a * a - a * others).sum(-1)
        size = size + a * a + abs(a * others)
    else:
        margin = own.sum(-1)
    return {"margin": margin, "cross": off.sum(-1), "bound": bound, "scale": size.sum(-1)}


def monotone(terms: dict[str, np.ndarray]) -> np.ndarray:
    """Every head's rate ``margin + cross`` non-negative to round-off (relative to its terms)."""
    return np.all(terms["margin"] + terms["cross"] >= -SIGN_RTOL * terms["scale"], axis=-1)


def certified(terms: dict[str, np.ndarray], omega: np.ndarray) -> np.ndarray:
    """The sufficient condition of Thm 39's form at the actual heads: ``margin_h >= omega bound_h`` for
    every head (then ``|cross_h| <= omega bound_h`` cannot make a rate negative)."""
    return np.all(terms["margin"] >= omega[..., None] * terms["bound"], axis=-1)


def predicted_overlap(terms: dict[str, np.ndarray]) -> np.ndarray:
    """The margin's prediction of the critical overlap at orthogonal heads: ``min_h margin_h /
    bound_h``, the smallest omega at which some cross term could cancel a head's own terms."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.min(terms["margin"] / terms["bound"], axis=-1)


def critical_overlap(x, base, direction, beta, spherical):
    """Per configuration, the overlap at which per-head monotonicity first fails along the perturbation
    ``M(s) = base + s direction`` (s from 0 up; inf when it never fails up to ``S_MAX`` times the largest
    strength). x (N, n, d), base and direction (N, H, d, d); base must be monotone at x."""
    strongest = np.abs(np.diagonal(base, axis1=-2, axis2=-1)).max()
    # The scores reach strongest + s: keep exp(beta * score) finite (cell.MAX_EXPONENT's rule).
    top = min(S_MAX * strongest, MAX_EXPONENT / beta - strongest)
    grid = np.concatenate([[0.0], top * np.geomspace(1e-4, 1.0, SCAN)])
    low, high = np.zeros(len(x)), np.full(len(x), np.inf)
    for s_low, s_high in zip(grid[:-1], grid[1:], strict=True):
        pending = np.isinf(high)
        if not pending.any():
            break
        heads = base[pending] + s_high * direction[pending]
        fails = ~monotone(head_terms(x[pending], heads, beta, spherical))
        rows = np.flatnonzero(pending)[fails]
        low[rows], high[rows] = s_low, s_high
    found = np.isfinite(high)
    for _ in range(BISECT):
        mid = 0.5 * (low[found] + high[found])
        s = mid[:, None, None, None]
        ok = monotone(head_terms(x[found], base[found] + s * direction[found], beta, spherical))
        low[found] = np.where(ok, mid, low[found])
        high[found] = np.where(ok, high[found], mid)
    omega = np.full(len(x), np.inf)
    omega[found] = cross_norms(base[found] + high[found][:, None, None, None] * direction[found])
    return omega


def orthogonal_part(strengths: np.ndarray, d: int) -> np.ndarray:
    """The block heads ``lambda_h P_h`` (..., H, d, d) of strengths (..., H): ``perturbed_block`` minus its
    perturbation."""
    H = strengths.shape[-1]
    k = d // H
    diagonal = np.zeros(strengths.shape + (d,))
    for h in range(H):
        diagonal[..., h, h * k:(h + 1) * k] = strengths[..., h, None]
    return diagonal[..., None] * np.eye(d)


def configuration_map(ds: xr.Dataset) -> xr.Dataset:
    """Per configuration (cell, seed, time, geometry) up to T_eps: whether the orthogonal heads are
    monotone there (1/0; NaN outside the window), and where they are, whether the perturbed heads are
    too, whether the sufficient condition certifies it, and the margin's prediction of the critical
    overlap; at up to ``CRITICAL_PER_RUN`` of those per run, the critical overlap along the run's own
    perturbation. Per (cell, seed), the overlap omega."""
    x = ds.x.transpose("cell", "seed", "time", "token", "dim").values
    heads = ds.score_matrix.transpose("cell", "seed", "head", ...).values
    base = orthogonal_part(ds.lam.transpose("cell", "seed", "head").values, x.shape[-1])
    delta = cell_values(ds, "cell_delta").values
    beta = cell_values(ds, "cell_beta").values
    with np.errstate(divide="ignore", invalid="ignore"):
        direction = np.where(delta[:, None, None, None, None] > 0,
                             (heads - base) / delta[:, None, None, None, None], 0.0)
    omega = cross_norms(heads)
    window = before_cluster(ds).transpose("cell", "seed", "time").values
    window &= np.isfinite(x).all(axis=(-2, -1))
    n_time = x.shape[2]
    stride = max(1, -(-n_time // CRITICAL_PER_RUN))
    sampled = window & (np.arange(n_time) % stride == 0)
    shape = x.shape[:3] + (len(GEOMETRIES),)
    keys = ("base_monotone", "monotone", "certified", "predicted_omega", "critical_omega")
    out = {key: np.full(shape, np.nan) for key in keys}
    for c in range(x.shape[0]):
        for g, geometry in enumerate(GEOMETRIES):
            spherical = geometry == "sphere"
            seeds, times = np.nonzero(window[c])
            # The sphere's rates at a flat run's configurations: its tokens brought onto the sphere.
            points = unit_rows(x[c, seeds, times]) if spherical else x[c, seeds, times]
            with_overlap = head_terms(points, heads[c, seeds], beta[c], spherical)
            without = head_terms(points, base[c, seeds], beta[c], spherical)
            base_ok = monotone(without)
            out["base_monotone"][c, seeds, times, g] = base_ok
            s, t = seeds[base_ok], times[base_ok]
            out["monotone"][c, s, t, g] = monotone(with_overlap)[base_ok]
            out["certified"][c, s, t, g] = certified(with_overlap, omega[c, seeds])[base_ok]
            out["predicted_omega"][c, s, t, g] = predicted_overlap(without)[base_ok]
            pick = base_ok & sampled[c, seeds, times]
            if delta[c] > 0 and pick.any():
                s, t = seeds[pick], times[pick]
                out["critical_omega"][c, s, t, g] = critical_overlap(
                    points[pick], base[c, s], direction[c, s], beta[c], spherical)
    dims = ("cell", "seed", "time", "geometry")
    result = xr.Dataset({key: (dims, value) for key, value in out.items()})
    result["omega"] = (("cell", "seed"), omega)
    return result.assign_coords(cell=ds.cell.values, geometry=list(GEOMETRIES), seed=ds.seed.values,
                                time=ds.time.values)


def omega_bins(omega: np.ndarray, count: int = 6) -> np.ndarray:
    """Geometric bin edges spanning the positive overlaps (exactly orthogonal heads, omega = 0, have
    nothing to survive and are left out)."""
    positive = omega[np.isfinite(omega) & (omega > 0)]
    if positive.size == 0:
        return np.array([])
    low, high = positive.min(), positive.max()
    if high <= low * 1.0001:
        return np.array([low / 1.2, high * 1.2])
    return np.geomspace(low * 0.999, high * 1.001, count + 1)


# The survival curve against omega over the margin's prediction: bins of that ratio.
RATIO_EDGES = np.geomspace(1 / 64, 64, 13)


def _pooled_share(flags: xr.DataArray, index: xr.DataArray, bins: int, keep: list[str]) -> xr.DataArray:
    """Share of 1s among the flags (NaN: not counted) per bin of ``index`` (-1 or ``bins``: outside),
    pooled over every dimension but ``keep``; dims (*keep, "bin")."""
    pooled = [flags.where(index == k).mean([d for d in flags.dims if d not in keep]) for k in range(bins)]
    return xr.concat(pooled, dim="bin").transpose(*keep, "bin")


class Orthogonality(Experiment):
    name = "orthogonality"
    theorem = "Thm 39"
    column_layout = False  # its panels side by side: drawn at a journal's text width
    question = ("At a configuration where exactly orthogonal heads are per-head monotone, does monotonicity "
                "survive an overlap omega = max ||M_h' M_h||_op small against the heads' own terms (Thm 39)? "
                "Pointwise over (omega, beta), on the sphere and in flat space, with the overlap's critical "
                "value per configuration against the margin's prediction of it.")
    axes = (Axis("delta", min_values=2, why="overlaps omega spread over a range (the map's x axis)"),
            Axis("beta", min_values=1))
    observables = ("energy", "radial", "positions")
    pinned = {
        "attention": ("usa", "Thm 16-17's decomposition of the per-head rates is usa's"),
        "heads": ("perturbed_block", "block heads plus a perturbation: the same configuration with and "
                                     "without the overlap"),
    }
    averages_other_axes = True  # the title names the axes pooled over
    # 2: pointwise at every configuration up to T_eps, with and without the overlap, on the sphere and
    # flat; binned by the measured omega; critical overlaps and the margin's prediction.
    reduction_version = 2
    defaults = {
        # Uniform tokens: exactly orthogonal heads are monotone at most of them (and everywhere in
        # flat space). Not x_i = e_i: that symmetric start flows to a saddle of the orthogonal heads'
        # dynamics (transverse rate beta e^(beta/2)), which any perturbation leaves with an O(1)
        # per-head violation whatever the overlap (docs/experiments.md).
        "fixed": {"rtol": 1e-07, "atol": 1e-10,
                  "heads": "perturbed_block", "attention": "usa", "geometry": "sphere", "init": "uniform",
                  "H": 2, "n": 8, "d": 8, "t_max": 10.0, "n_samples": 41, "seeds": 16},
        "grid": {"delta": [0.02, 0.05, 0.1, 0.25, 0.5], "beta": [0.25, 0.5, 1.0, 2.0]},
        "batch_over": ["delta", "beta"],
    }
    caption = ("Thm 39 pointwise: at every configuration a run visits up to T_eps (uniform random starts, "
               "usa on the sphere), the per-head energy rates with the perturbed heads and with their "
               "exactly orthogonal part, the same tokens both times; top, on the sphere (left) and in flat "
               "space (right), over (omega binned, beta; pooled over delta and seeds): colour and first "
               "number, the share of configurations "
               "where the orthogonal heads are monotone that stay monotone with the overlap omega = "
               "max ||M_h' M_h||_op; second number, the share the sufficient condition margin_h >= omega "
               "sum_i |u^h_i| sum_{h'!=h} |u^h'_i| certifies (actual |u|); white diamonds, the median of "
               "the margin's predicted critical omega min_h margin_h / sum_i |u^h_i| sum_{h'!=h} |u^h'_i| "
               "at the orthogonal heads. Bottom left: the share staying monotone against omega over that "
               "prediction, per configuration. Bottom right: each configuration's critical omega along "
               "its run's perturbation (M0 + s E, s from 0) against the prediction.")
    reading = ("Thm 39 says that where exactly orthogonal heads are per-head monotone, an overlap omega "
               "small against the heads' own terms keeps them so. The map is that statement measured "
               "configuration by configuration and pooled in bins of omega: survival stays near 1 at small "
               "omega. How far the heads' own terms reach varies from one configuration to the next, so "
               "the sharp test is bottom left, where each configuration's omega is in units of its own "
               "margin's prediction min_h margin_h / sum_i |u^h_i| sum_{h'} |u^h'_i| (diamonds on the map: "
               "its median), evaluated at the orthogonal heads: survival is 1 up to omega = that "
               "prediction and falls beyond it. The second number is a proof, not a measurement: where "
               "the condition holds a head cannot lose energy, so it never exceeds the first. Bottom "
               "right tests the prediction per configuration along its run's own perturbation: points "
               "on or above the diagonal fail no earlier than predicted (the bound on the cross term is "
               "a worst case over perturbation directions, and most random directions never fail: "
               "triangles); points below it fail earlier, where the perturbation "
               "also lowers a head's own terms, which the first-order prediction leaves out. In flat "
               "space the orthogonal heads are always monotone (their cross terms vanish), so there "
               "nothing is conditioned away; on the sphere the radial shadows of Thm 17 break "
               "monotonicity of the orthogonal heads themselves at some configurations, and those are "
               "left out (the titles give the share kept). The symmetric start x_i = e_i is not used: "
               "exactly orthogonal heads keep it on a symmetric path that ends at a saddle (transverse "
               "rate beta e^(beta/2), from a finite-difference Jacobian), and any break of the symmetry "
               "(a jitter of the start, any delta > 0, round-off) then brings the same O(1) violation, "
               "one head's energy falling by about e^(beta/2) as the cluster moves into one block, "
               "whatever the overlap: a race between the saddle's instability and the window, not a "
               "measure of omega.")

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        return configuration_map(ds)

    def derive(self, summary: xr.Dataset, spec) -> xr.Dataset:
        """The map over (omega bin, beta) per geometry, pooled over delta, seeds, samples and any other
        grid axis; survival against omega over the margin's prediction; the share of configurations
        where the orthogonal heads are monotone."""
        out = summary
        keep = ["beta", "geometry"] if "beta" in out.dims else ["geometry"]
        edges = omega_bins(out.omega.values)
        omega = out.omega.broadcast_like(out.monotone)
        if edges.size:
            index = xr.DataArray(np.digitize(omega, edges) - 1, dims=omega.dims, coords=omega.coords)
            bins = len(edges) - 1
            out["map_survival"] = _pooled_share(out.monotone, index, bins, keep).rename(bin="omega_bin")
            out["map_certified"] = _pooled_share(out.certified, index, bins, keep).rename(bin="omega_bin")
            counts = [out.monotone.where(index == k).count([d for d in omega.dims if d not in keep])
                      for k in range(bins)]
            out["map_configurations"] = xr.concat(counts, dim="omega_bin").transpose(*keep, "omega_bin")
            out["omega_edges"] = ("omega_edge", edges)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = omega / out.predicted_omega
        index = xr.DataArray(np.digitize(ratio, RATIO_EDGES) - 1, dims=ratio.dims, coords=ratio.coords)
        index = index.where(out.predicted_omega > 0, -1)  # a prediction of 0: no margin to spend
        out["ratio_survival"] = _pooled_share(out.monotone, index, len(RATIO_EDGES) - 1,
                                              ["geometry"]).rename(bin="ratio_bin")
        counts = [out.monotone.where(index == k).count([d for d in index.dims if d != "geometry"])
                  for k in range(len(RATIO_EDGES) - 1)]
        out["ratio_configurations"] = xr.concat(counts, dim="ratio_bin").transpose("geometry", "ratio_bin")
        out["ratio_edges"] = ("ratio_edge", RATIO_EDGES)
        out["base_share"] = out.base_monotone.mean([d for d in out.base_monotone.dims if d not in keep])
        return out

    def export_table(self, summary):
        """Per (geometry, beta): the median over configurations of the critical overlap along each run's
        perturbation and of the margin's prediction of it, the share of configurations failing no
        earlier than predicted, and the shares surviving and certified at the grid's smallest and
        largest delta."""
        from ..tables import requested_seeds, table

        ds = self.with_axes(summary, Spec.of(summary))
        others = [d for d in ds.monotone.dims if d not in ("delta", "beta", "seed", "time", "geometry")]
        pooled = ["delta", "seed", "time", *others]
        critical, predicted = ds.critical_omega, ds.predicted_omega
        known = critical.notnull() & predicted.notnull()
        low, high = ds.delta.values.min(), ds.delta.values.max()
        at = {"seed", "time", *others}
        columns = {
            "omega_critical": (critical.median(pooled), "median critical overlap omega along each run's "
                                                        "perturbation (inf: none up to the search's end)"),
            "omega_predicted": (predicted.where(known).median(pooled),
                                "median of the margin's prediction min_h margin_h / sum_i |u^h_i| "
                                "sum_h' |u^h'_i| at the orthogonal heads, same configurations"),
            "share_no_earlier": ((critical >= predicted).where(known).mean(pooled),
                                 "share of configurations whose critical omega is >= the prediction"),
            "survival_delta_min": (ds.monotone.sel(delta=low).mean(at),
                                   f"share staying monotone with the overlap at delta = {low:g}"),
            "survival_delta_max": (ds.monotone.sel(delta=high).mean(at),
                                   f"share staying monotone with the overlap at delta = {high:g}"),
            "certified_delta_min": (ds.certified.sel(delta=low).mean(at),
                                    f"share the sufficient condition certifies at delta = {low:g}"),
            "omega_delta_max": (ds.omega.sel(delta=high).median(["seed", *others]),
                                f"median overlap omega at delta = {high:g}"),
            "base_share": (ds.base_share, "share of configurations where the orthogonal heads are monotone"),
        }
        columns["seeds"] = (xr.DataArray(requested_seeds(summary)), "seeds per cell, which every share is "
                            "over (the experiment block's)", "1")
        return table(ds, ["geometry", "beta"], columns)

    def plot(self, summary, spec):
        from ._orthogonality_figure import plot

        return plot(self, summary, spec, GEOMETRIES)


EXPERIMENT = Orthogonality()
