"""The experiment of ``bench_scale.py``: what a sweep of 100,000 cheap cells costs to keep, not a theorem.

It reads two quantities per cell (the clustering time, censored runs at
infinity, and the integrator's accepted steps) and draws the steps over
(lambda_bar, beta): every cell read shows as one pixel. Its ``derive`` adds nothing: the
paper's experiments compute closed forms per grid point (quadratures), which
would measure the theory at 100,000 points rather than the storage, the start-up
checks and the aggregation this benchmark is about. Registered through the
config's ``experiment_modules`` (``benchmarks/`` on ``PYTHONPATH``).
"""

import numpy as np
import xarray as xr

from attnflow.experiments import Axis, Experiment


class ScaleProbe(Experiment):
    name = "scale_probe"
    theorem = "(benchmark)"
    question = "How long does a sweep of many cheap cells take to start, check and aggregate?"
    axes = (Axis("lambda_bar"), Axis("beta"))
    observables = ()
    defaults = {
        "fixed": {"attention": "softmax", "heads": "scalar", "H": 1, "n": 2, "d": 2, "init": "uniform",
                  "seeds": 1, "t_max": 1.0, "n_samples": 2},
        "grid": {"lambda_bar": [0.5, 1.0], "beta": [0.5, 1.0]},
        "batch_over": ["beta"],
    }
    caption = "Accepted integrator steps of the scale benchmark's cells over (lambda_bar, beta)."
    reading = "A benchmark of the infrastructure: the numbers only show that every cell was read."

    def reduce(self, ds: xr.Dataset) -> xr.Dataset:
        return xr.Dataset({"t_cluster": ds.t_cluster.where(~ds.censored, np.inf).median("seed"),
                           "steps": ds.n_steps.median("seed")})

    def plot(self, summary, spec):
        from attnflow.plotting import plt

        ds = self.with_axes(summary, spec)
        fig, ax = plt.subplots(figsize=(6, 4))
        steps = ds.steps.transpose("lambda_bar", "beta")
        mesh = ax.pcolormesh(ds.beta, ds.lambda_bar, steps, shading="nearest")
        fig.colorbar(mesh, label="accepted integrator steps (median over seeds)")
        ax.set(xscale="log", yscale="log", xlabel=r"$\beta$", ylabel=r"$\bar\lambda$",
               title=f"scale benchmark: {ds.sizes['beta'] * ds.sizes['lambda_bar']:,} cells, "
                     f"n={spec.fixed['n']}, d={spec.fixed['d']}, t_max={spec.fixed['t_max']}")
        return fig


EXPERIMENT = ScaleProbe()
