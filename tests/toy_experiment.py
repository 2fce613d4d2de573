"""A tests-only experiment, registered through the config's ``experiment_modules``.

It measures the sign of the sufficient Radial-Dominance margin at orthogonal
tokens over beta, whose boundary is known in closed form: beta*(H, n) (Thm 19).
"""

import xarray as xr

from attnflow import theory
from attnflow.experiments import Axis, Experiment


class ToyMargin(Experiment):
    name = "toy_margin"
    theorem = "Thm 19 (test)"
    question = "Where does the sufficient margin at orthogonal tokens change sign?"
    axes = (Axis("beta", min_values=2, why="a curve over beta"), Axis("n"))
    observables = ("radial",)
    defaults = {
        "fixed": {"init": "orthogonal", "heads": "scalar", "H": 2, "n": 8, "d": 8, "t_max": 0.01,
                  "n_samples": 2},
        "grid": {"beta": [0.25, 1.0]},
        "batch_over": ["beta"],
    }
    caption = "Sign of the sufficient margin at t = 0 against beta; dashed: beta*(H, n)."
    reading = "The sign flips at the dashed line."
    refine_axis = "beta"
    # Its summary variables, which attnflow.metadata does not know: an experiment module declares its own.
    metadata = {
        "margin": ("1", "sufficient Radial-Dominance margin at t = 0",
                   "min over heads, tokens and seeds of rd_margin_sufficient at t = 0"),
        "holds": ("1", "sufficient margin holds", "1 where margin >= 0, else 0"),
        "beta_star": ("1", "closed-form threshold beta*(H, n)", "Thm 19's sufficient threshold"),
    }

    def refine_field(self, summary):
        return summary.holds, 0.5

    def reduce(self, ds):
        margin = ds.rd_margin_sufficient.isel(time=0).min(("head", "token", "seed"))
        return xr.Dataset({"margin": margin, "holds": (margin >= 0).astype(float)})

    def derive(self, summary, spec):
        summary["beta_star"] = xr.apply_ufunc(theory.beta_star, int(spec.fixed["H"]), summary.n)
        return summary

    def plot(self, summary, spec):
        # Imported here, as the shipped experiments do: every snakemake start (the Snakefile builds the
        # registry) and every job imports this module, and pyplot costs 0.5 s of each.
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots()
        ds = self.with_axes(summary, spec).isel(n=0)
        ax.plot(ds.beta, ds.holds, "o-")
        ax.axvline(float(ds.beta_star), ls="--")
        ax.set_xlabel("beta")
        return fig


EXPERIMENT = ToyMargin()
