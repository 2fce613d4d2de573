"""Entropy production (Thm 27): attention entropy rises to log n as the tokens collapse."""

from __future__ import annotations

import numpy as np
import xarray as xr

from . import Axis, Experiment


def integrated_residual(entropy: np.ndarray, rate: np.ndarray, t: np.ndarray) -> float:
    """max |H(t) - H(0) - int_0^t dH/dt| / max |H - H(0)|, the integral by Simpson's rule.

    With the exact rate this is the quadrature's error at the samples' spacing (O(dt^4); first differences
    would be O(dt^2)): a wrong rate shows as O(1), but a small value is no round-off test of the identity.
    """
    from scipy.integrate import cumulative_simpson  # on use: every workflow job imports the registry

    integral = cumulative_simpson(rate, x=t, axis=-1, initial=0.0)
    change = entropy - entropy[..., :1]
    return float(np.max(np.abs(change - integral)) / max(np.max(np.abs(change)), 1e-300))


class EntropyExperiment(Experiment):
    """The ``entropy`` experiment (not ``attention.Entropy``, the rule an attention type declares)."""

    name = "entropy"
    theorem = "Thm 27"
    question = ("Does the exact entropy-production identity dH_i/dt = -beta^2 Cov_p(s, ds/dt) hold, and "
                "does the attention entropy of scalar heads from equiangular tokens rise to log n?")
    axes = (Axis("n"), Axis("beta"))
    observables = ("entropy",)
    defaults = {
        "fixed": {"heads": "scalar", "attention": "softmax", "H": 2, "d": 16, "init": "equiangular",
                  "gamma0": 0.1, "seeds": 1, "t_max": 5.0, "n_samples": 201, "rtol": 1e-9, "atol": 1e-12},
        "grid": {"n": [8, 16], "beta": [1.0, 4.0]},
        "batch_over": ["n", "beta"],
    }
    caption = ("Mean attention entropy against time for scalar heads from equiangular tokens, "
               "approaching log n (dashed), per n, coloured by beta (Thm 27). Titles give the quadrature "
               "error of the sampled rate: the exact entropy rate integrated over the samples by Simpson's "
               "rule against the stored entropy change, relative to the change.")
    reading = ("Each curve should rise monotonically to the dashed log n: as the tokens merge, every "
               "score equalises and attention spreads uniformly. The number in each title is the "
               "quadrature error of integrating the Thm 27 rate over the samples (it shrinks like dt^4 "
               "as the samples get denser), not a test of the identity, which holds at every sample to "
               "round-off; a wrong factor in the rate would make it O(1).")

    # 2: the residual is named for what it is, rate_quadrature_error (was thm27_residual, issue 52).
    reduction_version = 2

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        run = ("seed", "head", "token", "time")
        residual = xr.apply_ufunc(
            integrated_residual, ds.entropy, ds.entropy_rate, ds.time,
            input_core_dims=[list(run)] * 2 + [["time"]], vectorize=True,  # one residual per cell
            dask="allowed", output_dtypes=[float],
        )
        return xr.Dataset({
            "entropy": ds.entropy.mean(("seed", "head", "token")),
            "log_n": np.log(float(ds.sizes["token"])) + 0.0 * residual,
            "rate_quadrature_error": residual,
            "min_entropy_step": ds.entropy.diff("time").min(run),
        })

    def plot(self, summary, spec):
        # Drawing modules load here, not at module top: every workflow job imports the registry.
        from ..plotting import columns_for, figure_width, plt, sns, wrap

        ds = self.with_axes(summary, spec)
        ns = [int(n) for n in ds.n.values]
        width = figure_width()
        ncols = columns_for(len(ns), 2.2)
        nrows = -(-len(ns) // ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(width, min(2.4 * nrows + 1.0, 9.0)), squeeze=False,
                                 sharey=True, layout="constrained")
        colours = sns.color_palette("viridis", n_colors=ds.sizes["beta"])
        panel = 0.95 * width / ncols
        seeds = spec.fixed["seeds"] if isinstance(spec.fixed["seeds"], int) else len(spec.fixed["seeds"])
        for k, n in enumerate(ns):
            ax = axes[k // ncols, k % ncols]
            for beta, colour in zip(ds.beta.values, colours, strict=True):
                ax.plot(ds.time, ds.entropy.sel(n=n, beta=beta), color=colour,
                        label=rf"$\beta$ = {beta:g}" if k == 0 else None)
            # Under the curves: the beta = 1 curve sits on log n almost from the start.
            ax.axhline(np.log(n), color="0.45", ls="--", lw=1.2, zorder=0,
                       label=r"$\log n$" if k == 0 else None)
            res = float(ds.rate_quadrature_error.sel(n=n).max())
            ax.set_title(wrap(f"n = {n}; integrated rate vs entropy change: {res:.1e} (quadrature error "
                              f"on {ds.sizes['time']} samples)", panel, 8))
            ax.set_xlabel(r"time $t$")
            if k % ncols == 0:
                ax.set_ylabel("attention entropy (nat),\n" + ("mean over heads\nand tokens" if seeds == 1 else
                                                              f"mean over {seeds} seeds,\nheads and tokens"))
        for ax in axes.flat[len(ns):]:
            ax.set_visible(False)
        fig.legend(loc="outside right center")  # off the curves, which fill their panels
        fixed = self.describe_fixed(spec, ("attention", "heads", "H", "d", "init", "gamma0"))
        fig.suptitle(wrap(f"Entropy production (Thm 27); {fixed}; quadrature error: the exact rate "
                          "integrated over the samples (Simpson) against the stored entropy change",
                          0.95 * width, 9))
        return fig


EXPERIMENT = EntropyExperiment()
