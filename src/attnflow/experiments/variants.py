"""The paper's statements carried over to sigmoid attention and causal masking (docs/model.md, results
8-9)."""

from __future__ import annotations

import dataclasses

import numpy as np
import xarray as xr

from ..attention import ATTENTIONS, MASKS
from . import Axis, Experiment, Spec
from ._common import SIGN_RTOL, all_heads_monotone, monotone_judged

# Round-off of one float64 operation (2^-52): the unit of the residual's round-off bound.
EPS = float(np.finfo(np.float64).eps)


def residual_roundoff(ds: xr.Dataset) -> xr.DataArray:
    """Per seed, the round-off Thm 11's residual max_t |dE/dt - K| / max_t K can reach in float64.

    The rate dE/dt = (1/n) sum_i <dx_i/dt, g_i> is a sum of n dot products of d terms whose
    vectors g_i (the heads' outputs f^h_i, up to a factor) are mostly radial: the tangential
    part the identity pairs with the velocity is a small difference, and the computed velocity
    carries a radial round-off of eps |f|. Each term is exact to about (n + d) eps |f|^2 (the
    k-term summation bound, k eps), so the rate's error stays below (n + d) eps max_t |f|^2
    while K is of size max_t |P f|^2, in the same units (K/|P f|^2 is the attention's own
    factor, 1/n^2 for usa): the bound is (n + d) eps R, with R = max_t sum_i (sum_h |f^h_i|)^2
    / max_t sum_{i,h} |P f^h_i|^2 the radial-to-tangential ratio, from the radial observables
    (|f|^2 = a^2 + T). Maxima over time, not per time: a run that reaches a fixed point has a
    velocity and K of round-off size there, against an error of eps |f|^2. At large beta with
    random heads R reaches 10^3 and more, which is why usa's residual there nears 1e-10 while
    staying round-off. NaN at d = 1 on the sphere (no tangent space: T = K = 0).
    """
    n, d = ds.sizes["token"], ds.sizes["dim"]
    size = np.sqrt(ds.radial_shadow ** 2 + ds.tangential_power).sum("head")
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = (size ** 2).sum("token").max("time") / ds.tangential_power.sum(("head", "token")).max("time")
        return ((n + d) * EPS * ratio).where(np.isfinite(ratio) & (ratio > 0))


def gradient_flow(attention: str, mask: str) -> bool:
    """Whether the energy identity dE/dt = (1/n) sum_i ||dx_i/dt||^2 is a theorem for this variant."""
    return ATTENTIONS.get(attention).gradient_flow and not MASKS.get(mask).masked


class Variants(Experiment):
    name = "variants"
    theorem = "Thm 11, 19, 22 (results 8-9)"
    question = ("Which of the paper's statements survive sigmoid attention and causal masking? The four "
                "attention types, with and without the mask, side by side: total energy monotone (where "
                "the flow is a gradient flow), every head monotone, the clustering time, and where the "
                "final cluster sits relative to where token 0 started.")
    axes = (
        Axis("attention", min_values=2, why="variants side by side"),
        Axis("mask", min_values=1),
        Axis("beta", min_values=2, why="a map over beta"),
        Axis("heads", min_values=1),
    )
    # radial: the residual's round-off bound; energy_path: every head monotone between samples too
    observables = ("velocity", "energy", "energy_path", "positions", "radial")
    figures = ("", "clustering")  # variants.png: Thm 11 and 19; variants-clustering.png: result 9
    # 2: Thm 11's residual judged against its round-off bound, per run
    # 3: every head monotone judged at every accepted integration step (energy_path), not the samples only
    reduction_version = 3
    defaults = {
        "fixed": {"rtol": 1e-11, "atol": 1e-14,
                  "H": 2, "n": 8, "d": 8, "lambda_dist": "linear", "lambda_bar": 1.0, "spread": 0.5,
                  "init": "uniform", "t_max": 20.0, "n_samples": 41, "seeds": 16},
        "grid": {"heads": ["scalar", "random"], "attention": ["softmax", "usa", "relu", "sigmoid"],
                 "mask": ["none", "causal"], "beta": [0.5, 1.0, 2.0, 4.0]},
        "batch_over": ["beta", "mask", "attention"],
    }
    caption = ("The paper's statements under sigmoid attention and causal masking, in two figures. Rows: "
               "attention type and mask (gradient flows starred); columns: beta; one block of rows per "
               "head structure. variants.png: fraction of runs whose total energy never falls; Thm 11's "
               "residual max|dE/dt - K| / max K divided by its float64 round-off bound, computed per run "
               "from n, d and the radial-to-tangential ratio of the heads' outputs (log10; at most 0: the "
               "identity holds to round-off; the worst seed); fraction of runs with every head monotone. "
               "variants-clustering.png: median clustering time; how far the tokens end from where token 0 "
               "started (log10).")
    reading = ("Gradient flows (usa and sigmoid, unmasked; marked with a star) must show a residual within "
               "its round-off bound (log10 of the ratio at most 0, blue) and a total energy that never falls "
               "(fraction 1): that is Thm 11 and its sigmoid analogue (result 8). The bound is computed per "
               "run, not fixed: at large beta with random heads the heads' outputs are almost radial, and "
               "the round-off of the rate grows with the radial-to-tangential ratio (usa at beta = 4 reaches "
               "a residual near 1e-10, still below its bound). At d = 1 on the sphere the residual is "
               "undefined (no tangent space: K = 0) and the panel says so. Softmax and relu are not "
               "gradient flows of the energy, and a causal mask breaks the identity for every type: the "
               "residual panel says by how much (12 to 15 orders of magnitude above round-off). Per-head "
               "monotonicity (Thm 19) is a small-beta property: read where the fraction leaves 1 along "
               "beta. In variants-clustering.png: with scalar heads under a causal mask, token 0 never "
               "moves, and for softmax, usa and sigmoid every token converges to it (result 9): the last "
               "panel falls towards round-off there as the runs converge (in the default grid usa and "
               "sigmoid slowest at small beta, softmax at large beta), while unmasked the cluster forms "
               "away from token 0's start (distance O(1)). relu weights vanish between tokens with "
               "negative cosine, so relu runs freeze into several clusters, masked or not. Random heads "
               "carry no such fact. The median clustering time counts censored runs as later than t_max "
               "(blank where most are).")

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        total = ds.energy_rate.sum("head")
        scale = abs(total).max("time")
        kinetic = ds.kinetic.max("time")
        # Where the tokens end up, against where token 0 started: under a mask with scalar heads
        # token 0 never moves and the cluster forms on it (result 9); unmasked it forms elsewhere.
        start = ds.x.isel(time=0, token=0)
        distance = np.sqrt(((ds.x.isel(time=-1) - start) ** 2).sum("dim")).max("token")
        residual = abs(total - ds.kinetic).max("time") / kinetic  # per seed; 0/0 at d = 1 (no tangent space)
        bound = residual_roundoff(ds)
        with np.errstate(invalid="ignore", divide="ignore"):
            excess = residual / bound
        return xr.Dataset({
            "frac_total_monotone": (total >= -SIGN_RTOL * scale).all("time").mean("seed"),
            "energy_residual": residual.max("seed"),
            "energy_residual_bound": bound.max("seed"),
            "energy_residual_excess": excess.max("seed"),
            "frac_heads_monotone": all_heads_monotone(ds).all("time").mean("seed"),
            # Censored runs count as later than any time (the median of the clustering time,
            # not of the runs that clustered); inf where most runs are censored.
            "t_cluster_median": ds.t_cluster.where(~ds.censored, np.inf).median("seed"),
            "frac_censored": ds.censored.mean("seed"),
            "distance_from_token0": distance.median("seed"),
        })

    def derive(self, summary: xr.Dataset, spec: Spec) -> xr.Dataset:
        """The residual's variables say when they are NaN by construction (d = 1 on the sphere)."""
        summary.attrs["monotone_judged"] = monotone_judged(spec)
        why = residual_undefined(spec)
        for var in RESIDUALS:
            if why and var in summary:
                summary[var].attrs["comment"] = why
        return summary

    def export_table(self, summary):
        """Per variant (attention, mask, head structure): whether it is a gradient flow, Thm 11's
        largest residual and the least share of runs with a monotone total energy over beta, and how
        far along beta every run keeps every head monotone (Thm 19's small-beta property). No closed
        form: beta* is derived for equal scalar heads, the beta_star experiment's setting."""
        from ..tables import requested_seeds, table

        ds = self.with_axes(summary, Spec.of(summary))
        lines = [d for d in ds.frac_heads_monotone.dims if d != "beta"]
        heads = ds.frac_heads_monotone.sortby("beta")
        held = (heads >= 1.0).astype(int).cumprod("beta").astype(bool)  # at every beta up to this one
        attention, mask = ds.attention.values, ds.mask.values
        flows = xr.DataArray([[float(gradient_flow(str(a), str(m))) for m in mask] for a in attention],
                             dims=("attention", "mask"), coords={"attention": attention, "mask": mask})
        columns = {
            "gradient_flow": (flows, "1 if the flow is a gradient flow of its energy (Thm 11, result 8)"),
            "energy_residual_max": (ds.energy_residual.max("beta"), "largest Thm 11 residual "
                                    "max|dE/dt - K| / max K over the line (round-off for a gradient flow)"),
            **({"energy_residual_roundoff": (
                (ds.energy_residual_excess <= 1.0).all("beta").astype(float),
                "1 if every run's Thm 11 residual is within its float64 round-off bound at every beta of "
                "the line (the identity holds to round-off)")} if "energy_residual_excess" in ds else {}),
            "frac_total_monotone_min": (ds.frac_total_monotone.min("beta"), "least share of runs whose "
                                        "total energy never falls, over the line"),
            "beta_heads_all": (heads.beta.where(held).max("beta"), "largest grid beta up to which every run "
                               "keeps every head monotone, from the smallest beta on (NaN: not even there)"),
            "frac_heads_monotone_min": (heads.min("beta"), "least share of runs with every head monotone, "
                                        "over the line"),
        }
        columns["seeds"] = (xr.DataArray(requested_seeds(summary)), "seeds per cell, which every share is "
                            "over (the experiment block's)", "1")
        return table(ds, lines, columns)

    def plot(self, summary, spec, part=""):
        # Drawing modules load here, not at module top: every workflow job imports the registry.
        from ..plotting import MIN_TEXT, columns_for, figure_width, plt, sns, wrap

        ds = self.with_axes(summary, spec)
        structures = [str(h) for h in ds.heads.values]
        panels = [p for p in PANELS if p.part == part]
        undefined = residual_undefined(spec)
        if "energy_residual_excess" not in ds:  # a summary of reduction 1: the residual alone
            panels = [p if p.var != "energy_residual_excess" else OLD_RESIDUAL_PANEL for p in panels]
        rows = [(a, m) for a in ds.attention.values for m in ds.mask.values]
        labels = [f"{a}{' / ' + m if MASKS.get(m).masked else ''}{' *' if gradient_flow(a, m) else ''}"
                  for a, m in rows]
        # The panels of one head structure side by side while each keeps 1.7 in (four beta columns of
        # 7 pt numbers), otherwise on further rows; the head structures one under the other.
        ncols = columns_for(len(panels), 1.7)
        per_structure = -(-len(panels) // ncols)
        nrows = per_structure * len(structures)
        width = figure_width()
        row_height = 0.19 * len(rows) + 0.55  # a heatmap row of 7 pt text, the panel's title and beta axis
        fig, axes = plt.subplots(nrows, ncols, squeeze=False, layout="constrained",
                                 figsize=(width, min(nrows * row_height + 0.9, 9.0)))
        used = {(r * per_structure + k // ncols, k % ncols) for r in range(len(structures))
                for k in range(len(panels))}
        for (i, j), ax in np.ndenumerate(axes):
            ax.set_visible((i, j) in used)
        inches = (width - 1.1) / ncols  # a heatmap, beside the first column's row labels
        # One colour scale per panel across the head structures (the same quantity), stretched to the
        # data where it leaves the nominal range (a residual of 10^2 must not read as 10^0).
        shown = {p.var: np.log10(np.maximum(ds[p.var], 1e-16)) if p.log else ds[p.var] for p in panels}
        scales = {}
        for p in panels:
            data = np.asarray(shown[p.var].values, dtype=float)
            data = data[np.isfinite(data)]
            low, high = p.limits or (np.inf, -np.inf)
            if data.size:
                low, high = min(low, data.min()), max(high, data.max())
            scales[p.var] = (low, high) if low <= high else (0.0, 1.0)  # no limits and no data
        betas = [f"{b:g}" for b in ds.beta.values]
        for r, heads in enumerate(structures):
            sub = {p.var: shown[p.var].sel(heads=heads) for p in panels}
            for k, p in enumerate(panels):
                ax = axes[r * per_structure + k // ncols, k % ncols]
                panel = sub[p.var]
                values = np.array([[float(panel.sel(attention=a, mask=m, beta=b)) for b in ds.beta.values]
                                   for a, m in rows])
                # A median clustering time beyond t_max is +inf (a failed cell is NaN): blank, and said so.
                censored = np.isinf(values) & (p.var == "t_cluster_median")
                values[np.isinf(values)] = np.nan
                vmin, vmax = scales[p.var]
                if p.centre is not None:  # a diverging map centred where the judgement changes
                    reach = max(abs(vmin - p.centre), abs(vmax - p.centre))
                    vmin, vmax = p.centre - reach, p.centre + reach
                sns.heatmap(values, ax=ax, cmap=p.cmap, vmin=vmin, vmax=vmax, annot=True, fmt=p.fmt,
                            annot_kws={"fontsize": MIN_TEXT}, xticklabels=betas,
                            yticklabels=labels if k % ncols == 0 else False, cbar=False,
                            mask=~np.isfinite(values))
                ax.grid(False)  # the theme's grid would run through the blank (censored) cells
                for text in ax.texts:
                    if text.get_text().startswith("-") and float(text.get_text()) == 0:
                        text.set_text(text.get_text()[1:])  # -0.0: a value that rounds to 0
                # Row labels across: seaborn stands them on end when it thinks they overlap.
                ax.tick_params(axis="y", labelrotation=0)
                ax.tick_params(axis="x", labelrotation=0)
                for i, j in zip(*np.nonzero(censored), strict=True):
                    ax.text(j + 0.5, i + 0.5, "cens.", ha="center", va="center", fontsize=MIN_TEXT,
                            color="0.4")
                if p.var in RESIDUALS and undefined:
                    ax.text(0.5, 0.5, wrap(undefined, 0.9 * inches), transform=ax.transAxes,
                            ha="center", va="center", fontsize=MIN_TEXT, color="0.3")
                ax.set_xlabel(r"$\beta$")
                ax.set_title(wrap(f"{p.title}; {heads} heads", inches, 8), fontsize=8)
        seeds = spec.fixed["seeds"]
        fixed = self.describe_fixed(spec, ("H", "n", "d", "lambda_dist", "spread", "init", "t_max",
                                           "cluster_threshold"))
        count = seeds if isinstance(seeds, int) else len(seeds)
        if part == "":
            title = ("Sigmoid attention and causal masking against Thm 11 and Thm 19 (* = gradient flow: "
                     f"Thm 11 / result 8 apply); {fixed}, {count} seeds")
        else:
            title = ("Sigmoid attention and causal masking: clustering (result 9); blank: most runs censored "
                     f"at t_max (censored share over the map {float(ds.frac_censored.mean()):.2f}); {fixed}, "
                     f"{count} seeds")
        fig.suptitle(wrap(title, 0.95 * width, 9), fontsize=9)
        return fig


@dataclasses.dataclass(frozen=True)
class Panel:
    """One heatmap of the figure: a summary variable over (attention and mask, beta)."""

    var: str
    title: str
    cmap: str
    limits: tuple | None
    log: bool
    fmt: str
    part: str  # the figure it belongs to (Variants.figures)
    centre: float | None = None  # a diverging colour map centred here


PANELS = (
    Panel("frac_total_monotone", "runs with total energy monotone", "viridis", (0, 1), False, ".2f", ""),
    Panel("energy_residual_excess",
          r"Thm 11 residual / its round-off bound ($\log_{10}$; $\leq 0$: round-off)", "RdBu_r", (-3, 3),
          True, ".1f", "", centre=0.0),
    Panel("frac_heads_monotone", "runs with every head monotone", "viridis", (0, 1), False, ".2f", ""),
    Panel("t_cluster_median", r"median $T_\varepsilon$ (time)", "cividis", None, False, ".1f", "clustering"),
    Panel("distance_from_token0", r"$\log_{10}$ max$_i\,\|x_i(t_{max}) - x_0(0)\|$", "magma", (-16, 0.5),
          True, ".1f", "clustering"),
)
# A summary of reduction 1 holds the residual without its bound: drawn as it was, against -10.
OLD_RESIDUAL_PANEL = Panel("energy_residual", r"$\log_{10}$ Thm 11 residual", "magma", (-16, 0), True, ".1f",
                           "")
RESIDUALS = ("energy_residual", "energy_residual_excess", "energy_residual_bound")


def residual_undefined(spec) -> str:
    """Why Thm 11's residual is undefined on this spec's cells ("" where it is defined): on the sphere at
    d = 1 the tokens sit at +-1 with no tangent space, so the velocity and K vanish and the residual
    max|dE/dt - K| / max K is 0/0 (NaN in every cell, by construction)."""
    if int(spec.fixed.get("d", 0)) == 1 and spec.fixed.get("geometry", "sphere") == "sphere":
        return "undefined at d = 1: the sphere S^0 has no tangent space, so K = 0 and the residual is 0/0"
    return ""


EXPERIMENT = Variants()
