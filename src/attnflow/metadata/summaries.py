"""Units, long names and descriptions of the summary variables, by experiment (``SUMMARIES``); an
experiment's own ``metadata`` adds to them (``attnflow.metadata.describe_summary``)."""

from __future__ import annotations

from ..units import FLOW_TIME, TIME_UNITS
from .meta import Meta

_T = FLOW_TIME
# What beta_star and trained_heads decided for a seed whose run failed at a grid end (issue 52).
UNDETERMINED = ("seeds with a run on the line whose threshold is neither placed on the grid nor censored "
                "below or above it: the run at the smallest beta failed and the first computed beta fails "
                "already (or the run at the largest failed and every computed beta holds), so the threshold "
                "may or may not be beyond the grid; left out of the threshold and of the below/above "
                "fractions")
_CENSORED_INF = "+inf where the run had not clustered by t_max (censored), NaN where no run"
# Summary variables, by experiment: one name may mean a different thing in two experiments.
SUMMARIES: dict[str, dict[str, Meta]] = {
    "energy": {
        "energy_total": Meta("1", "total energy",
                             "sum over heads of the per-head energy E_h, mean over seeds"),
        "energy_head": Meta("1", "per-head energy", "per-head energy E_h, mean over seeds"),
        "energy_rate_min": Meta("1", "smallest per-head energy rate",
                                f"dE_h/dt per unit {_T}, smallest over seeds"),
        "thm11_residual": Meta("1", "Thm 11 residual",
                               "max over seeds and samples of |sum_h dE_h/dt - kinetic| / max kinetic "
                               "(0: the total energy rate is the kinetic term, Thm 11)"),
        "frac_head_falling": Meta("1", "fraction of samples with a falling head",
                                  "fraction of (seed, sample) pairs at which some head's energy rate is "
                                  "negative beyond round-off"),
    },
    "beta_star": {
        "mono_t0": Meta("1", "every head monotone at t = 0",
                        "per seed: 1 where every head's energy rate is >= 0 (to round-off) at t = 0, else 0"),
        "mono_path": Meta("1", "every head monotone up to clustering",
                          "per seed: 1 where every head's energy rate is >= 0 (to round-off) at every sample "
                          "and every accepted integration step up to t_cluster (the whole run when "
                          "censored; the attrs' monotone_judged says which), else 0"),
        "rd_t0": Meta("1", "start inside Radial Dominance",
                      "per seed: 1 where Radial Dominance (rd_margin >= 0 for every head and token) holds "
                      "at t = 0, else 0"),
        "time_rd": Meta("1", "share of the run inside Radial Dominance",
                        "per seed: fraction of the samples up to t_cluster at which Radial Dominance holds"),
        **{f"beta_{p}": Meta("1", f"threshold in beta of {what}, per seed",
                             f"per seed: geometric midpoint of the grid bracket in beta where {what} first "
                             "fails; NaN where it fails at the smallest beta or never on the grid")
           for p, what in (("mono", "per-head monotonicity"), ("rd", "Radial Dominance at t = 0"))},
        **{f"beta_{p}_mean": Meta("1", f"threshold in beta of {what}", f"mean over seeds of beta_{p}")
           for p, what in (("mono", "per-head monotonicity"), ("rd", "Radial Dominance at t = 0"))},
        **{f"beta_{p}_ci": Meta("1", f"95% half-width of beta_{p}_mean",
                                f"half-width of the 95% Student-t interval of the mean of beta_{p}")
           for p in ("mono", "rd")},
        **{f"beta_{p}_below_grid": Meta("1", "fraction of seeds below the grid",
                                        f"fraction of the seeds placed (on, below or above the grid) failing "
                                        f"at the smallest beta (beta_{p} below it)")
           for p in ("mono", "rd")},
        **{f"beta_{p}_above_grid": Meta("1", "fraction of seeds above the grid",
                                        f"fraction of the seeds placed holding at every beta through the "
                                        f"largest (beta_{p} above it)")
           for p in ("mono", "rd")},
        **{f"beta_{p}_undetermined": Meta("1", "seeds not placed", UNDETERMINED) for p in ("mono", "rd")},
        "frac_mono_t0": Meta("1", "fraction of seeds monotone at t = 0", "mean over seeds of mono_t0"),
        "frac_mono_path": Meta("1", "fraction of seeds monotone up to clustering",
                               "mean over seeds of mono_path"),
        "frac_time_rd": Meta("1", "mean share of the run inside Radial Dominance",
                             "mean over seeds of time_rd"),
        "frac_runs_rd": Meta("1", "fraction of runs always inside Radial Dominance",
                             "fraction of seeds inside Radial Dominance at every sample up to t_cluster"),
        "beta_star_closed": Meta("1", "closed-form threshold beta*(H, n)",
                                 "Thm 19's sufficient threshold beta*(H, n) at mean head strength alpha"),
        "beta_orthogonal": Meta("1", "threshold at orthogonal tokens, by bisection",
                                "largest beta at which the sufficient Radial-Dominance margin holds at "
                                "orthogonal tokens, by bisection on the engine's margin (checks "
                                "beta_star_closed)"),
    },
    "superadditivity": {
        "t_cluster": Meta(TIME_UNITS, "clustering time", f"per seed, in {_T}; {_CENSORED_INF}"),
        "ratio_seed": Meta("1", "equal over linear clustering time, per seed",
                           "per seed: t_cluster with equal strengths / t_cluster with linear strengths (the "
                           "same tokens); NaN where either run is censored (its ratio is only bounded)"),
        "ratio_low": Meta("1", "lower bound of the median ratio",
                          "median over seeds of each paired ratio's lower end: the ratio itself, t_max / "
                          "T(linear) where only the equal run is censored, 0 where the linear one is"),
        "ratio_high": Meta("1", "upper bound of the median ratio",
                           "median over seeds of each paired ratio's upper end: the ratio itself, "
                           "T(equal) / t_max where only the linear run is censored, inf where the equal one "
                           "is"),
        "ratio": Meta("1", "equal over linear clustering time",
                      "median over seeds of the paired ratio, censored pairs as the intervals they bound: "
                      "where ratio_low = ratio_high; NaN where censoring leaves the median undetermined"),
        "censored_equal": Meta("1", "fraction censored, equal strengths",
                               "fraction of seeds with equal strengths not clustered by t_max"),
        "censored_linear": Meta("1", "fraction censored, linear strengths",
                                "fraction of seeds with linear strengths not clustered by t_max"),
        "lambda_c": Meta("1", "critical mean head strength", "closed form lambda_c(beta, n) (Thm 22)"),
        "early_sign": Meta("1", "sign of the early-time gain",
                           "closed form: sign of the early-time advantage of unequal strengths (Thm 22)"),
        "ratio_closed": Meta("1", "equal over linear clustering time, closed form",
                             "the equiangular ODE's time to the criterion's level, equal / linear strengths"),
    },
    "clustering_time": {
        "t_cluster": Meta(TIME_UNITS, "clustering time", f"per seed, in {_T}; {_CENSORED_INF}"),
        "clusters_end": Meta("1", "clusters at t_max", "per seed: cluster_count at the last sample"),
        "t_closed": Meta(TIME_UNITS, "clustering time, closed form",
                         f"the equiangular ODE's time from gamma0 = 1/sqrt(d) to the level, in {_T}"),
        "t_bound": Meta(TIME_UNITS, "clustering time bound from the initial drive",
                        f"the bound from the initial drive (Thm 25), in {_T}"),
        "regime": Meta("1", "inside the theorem's regime", "1 where (n, d) lies in Thm 25's regime, else 0"),
        "t_equiangular": Meta(TIME_UNITS, "clustering time from equiangular tokens",
                              f"median over seeds from equiangular_typical tokens, in {_T}"),
        "rel_error": Meta("1", "relative error against the closed form", "t_equiangular / t_closed - 1"),
        "exponent_n": Meta("1", "exponent of n, in the regime", "least-squares slope of log T against log n "
                                                                "over the n inside the regime"),
        "exponent_n_all": Meta("1", "exponent of n", "least-squares slope of log T against log n, every n"),
        "log_d_slope": Meta(TIME_UNITS, "slope of T against log d",
                            f"least-squares slope dT / d(log d) at fixed n, in {_T}"),
        "log_d_slope_relu_bound": Meta(TIME_UNITS, "relu bound on the slope of T against log d",
                                       f"n / (4 beta sum_h lambda_h^2), in {_T}"),
        "censored_uniform": Meta("1", "fraction censored, uniform tokens",
                                 "fraction of seeds from uniform tokens not clustered by t_max"),
        "clusters_uniform": Meta("1", "clusters at t_max, uniform tokens",
                                 "median over seeds of clusters_end"),
        "clusters_uniform_q1": Meta("1", "clusters at t_max, lower quartile",
                                    "first quartile over seeds of clusters_end (uniform tokens)"),
        "clusters_uniform_q3": Meta("1", "clusters at t_max, upper quartile",
                                    "third quartile over seeds of clusters_end (uniform tokens)"),
    },
    "clustering_probability": {
        "t_cluster": Meta(TIME_UNITS, "clustering time", f"per seed, in {_T}; {_CENSORED_INF}"),
        "probability": Meta("1", "fraction of runs clustered", "fraction of seeds with t_cluster <= time"),
        "probability_low": Meta("1", "fraction clustered, 95% lower bound",
                                "Wilson score interval, lower end"),
        "probability_high": Meta("1", "fraction clustered, 95% upper bound",
                                 "Wilson score interval, upper end"),
        "t_median": Meta(TIME_UNITS, "median clustering time", f"median over seeds of t_cluster, in {_T}"),
        "t_closed": Meta(TIME_UNITS, "clustering time, closed form",
                         f"the equiangular ODE's time from gamma0, the starts' mean cosine, to the level, "
                         f"in {_T}"),
        "gamma_start": Meta("1", "mean cosine of the start",
                            "per seed: the mean pairwise cosine of the initial tokens"),
        "median_over_closed": Meta("1", "median over closed-form clustering time",
                                   "t_median / t_closed (near 1: the closed form holds)"),
    },
    "crossover": {
        "t_cluster": Meta(TIME_UNITS, "clustering time", f"per seed, in {_T}; {_CENSORED_INF}"),
        "frozen": Meta("1", "frozen into several clusters",
                       "per seed: 1 where the run never reached the level and ended with 2 or more clusters"),
        "clusters_end": Meta("1", "clusters at t_max", "per seed: cluster_count at t_max of a censored run"),
        "ratio_closed": Meta("1", "relu over softmax clustering time, closed form",
                             "T_relu / T_softmax of the equiangular ODE"),
        "ratio": Meta("1", "relu over softmax clustering time",
                      "median T_relu / median T_softmax over seeds"),
        "ran": Meta("1", "both attention types ran", "1 where both types' runs are there, else 0"),
        "rel_error": Meta("1", "relative error against the closed form",
                          "ratio (equiangular) / ratio_closed - 1"),
        "frozen_fraction": Meta("1", "fraction of relu runs frozen", "mean over seeds of frozen, relu"),
        "ratio_closed_fine": Meta("1", "relu over softmax clustering time, closed form (fine grid)",
                                  "T_relu / T_softmax of the equiangular ODE on the fine grid"),
        "beta_cross": Meta("1", "crossover inverse temperature",
                           "beta above which relu clusters faster than softmax (closed form)"),
    },
    "scaling": {
        "t_cluster": Meta(TIME_UNITS, "clustering time",
                          f"per seed, in {_T}; +inf where the run had not reached the level by t_max, NaN "
                          "where no run"),
        "frozen": Meta("1", "frozen into several clusters",
                       "per seed: 1 where the run never reached the level and ended with 2 or more clusters"),
        "clusters_end": Meta("1", "clusters at t_max", "per seed: cluster_count at t_max of a censored run"),
        "t_median": Meta(TIME_UNITS, "median clustering time",
                         f"median over seeds of t_cluster (inf when half the runs or more are censored), "
                         f"in {_T}"),
        "t_q1": Meta(TIME_UNITS, "clustering time, lower quartile", f"first quartile over seeds, in {_T}"),
        "t_q3": Meta(TIME_UNITS, "clustering time, upper quartile", f"third quartile over seeds, in {_T}"),
        "censored_fraction": Meta("1", "fraction of runs censored",
                                  "fraction of seeds not at the level by t_max"),
        "frozen_fraction": Meta("1", "fraction of runs frozen", "mean over seeds of frozen"),
        "clusters_frozen": Meta("1", "clusters of the censored runs",
                                "median over the censored seeds of clusters_end (NaN: none censored)"),
        "t_closed": Meta(TIME_UNITS, "clustering time, closed form",
                         f"the equiangular ODE's time from gamma0 = 1/sqrt(d) to the level, in {_T}"),
        "regime": Meta("1", "inside the theorem's regime", "1 where (n, d) lies in Thm 25's regime, else 0"),
        "median_over_closed": Meta("1", "median over closed-form clustering time", "t_median / t_closed"),
        "log_n_slope": Meta(TIME_UNITS, "slope of T against log n",
                            f"least-squares dT / d(ln n) of t_median at fixed d, in {_T}"),
        "log_n_slope_closed": Meta(TIME_UNITS, "slope of the closed-form T against log n",
                                   f"the same fit of t_closed, in {_T}"),
        "log_d_slope": Meta(TIME_UNITS, "slope of T against log d",
                            f"least-squares dT / d(ln d) of t_median at fixed n, in {_T}"),
        "log_d_slope_closed": Meta(TIME_UNITS, "slope of the closed-form T against log d",
                                   f"the same fit of t_closed, in {_T}"),
        "n_fine": Meta("1", "number of tokens (closed-form contours)", "the fine n grid of t_closed_fine"),
        "d_fine": Meta("1", "dimension (closed-form contours)", "the fine d grid of t_closed_fine"),
        "t_closed_fine": Meta(TIME_UNITS, "clustering time, closed form (fine grid)",
                              f"t_closed on the fine (n, d) grid of the contours, in {_T}"),
    },
    "metastability": {
        "cluster_count": Meta("1", "number of clusters", "per seed and sample: cluster_count"),
        "plateau": Meta(TIME_UNITS, "longest plateau",
                        f"per seed: length of the longest plateau (a count of 2 to n/2 clusters entered by a "
                        f"merge and held at least as long as the time it began at), in {_T}"),
        "plateau_censored": Meta("1", "plateau still on at t_max",
                                 "per seed: 1 where the longest plateau lasts to t_max (a lower bound)"),
        "plateau_count": Meta("1", "clusters on the longest plateau",
                              "per seed: the plateau's cluster count"),
        "count_median": Meta("1", "number of clusters, median", "median over seeds of cluster_count"),
        "count_q1": Meta("1", "number of clusters, lower quartile", "first quartile over seeds"),
        "count_q3": Meta("1", "number of clusters, upper quartile", "third quartile over seeds"),
        "plateau_median": Meta(TIME_UNITS, "longest plateau, median", f"median over seeds, in {_T}"),
        "censored_fraction": Meta("1", "fraction of plateaus censored",
                                  "mean over seeds of plateau_censored"),
        "fitted": Meta("1", "in the fit",
                       "1 where some run has a plateau at this beta (the fits use these betas)"),
        "fit_rate": Meta("1", "exponential growth rate",
                         "slope of log L against beta, censored-data (Tobit) maximum likelihood, censored "
                         "plateaus as lower bounds"),
        "fit_rate_half": Meta("1", "exponential growth rate, 95% half-width",
                              "Student-t interval of fit_rate from the likelihood's curvature"),
        "fit_rate_intercept": Meta("1", "exponential fit intercept", "intercept of log L against beta"),
        "fit_power": Meta("1", "power-law exponent",
                          "slope of log L against log beta, censored-data (Tobit) maximum likelihood"),
        "fit_power_half": Meta("1", "power-law exponent, 95% half-width",
                               "Student-t interval of fit_power from the likelihood's curvature"),
        "fit_power_intercept": Meta("1", "power-law fit intercept", "intercept of log L against log beta"),
        "fit_verdict": Meta("1", "favoured growth law", "which of the two fits the data favour, in words"),
        "fit_loglik_margin": Meta("1", "log-likelihood margin of the verdict",
                                  "maximised log-likelihood of the exponential fit minus the power law's "
                                  "(the verdict needs more than 2 either way)"),
        "fit_runs": Meta("1", "runs fitted", "runs with a plateau entering the fits"),
        "fit_censored": Meta("1", "censored runs fitted",
                             "runs fitted whose plateau outlasted t_max (lower bounds)"),
    },
    "entropy": {
        "entropy": Meta("1", "attention entropy (nats)", "mean over seeds (where several), heads and tokens "
                                                         "of the attention entropy, natural logarithm"),
        "log_n": Meta("1", "log n (nats)", "the largest entropy, log n: the entropy's limit (Thm 27)"),
        "rate_quadrature_error": Meta("1", "quadrature error of the sampled entropy rate",
                                      "largest gap between the entropy change and the integral, by Simpson's "
                                      "rule over the samples, of the stored exact rate, relative to the "
                                      "change: the quadrature's error at this sampling (it shrinks like "
                                      "dt^4), not a test of Thm 27's identity, which holds at every sample "
                                      "to round-off"),
        "min_entropy_step": Meta("1", "smallest entropy step (nats)",
                                 "smallest change of the entropy between samples (>= 0: non-decreasing)"),
    },
    "normalization": {
        "t_cluster": Meta(TIME_UNITS, "clustering time", "per seed, the first time the mean cosine reaches "
                          f"cluster_threshold, in {_T}; {_CENSORED_INF}"),
        "epsilon": Meta("1", "epsilon", "1 - gamma_min at each sample, median over seeds"),
        "radius_mean": Meta("1", "mean token radius", "mean token radius at each sample, median over seeds"),
        "clusters_depth": Meta("1", "clusters at the depth", "per seed, the cluster count at the sample "
                               "nearest the experiment's depth (t_max where shorter; the summary's depth "
                               "attribute)"),
        "lam": Meta("1", "head strength", "head strengths lambda_h of the cell"),
        "t_closed": Meta(TIME_UNITS, "clustering time, closed form", "quadrature of the equiangular ODEs of "
                         f"result 12 from gamma0 to cluster_threshold, in {_T}"),
        "t_median": Meta(TIME_UNITS, "median clustering time", f"median over seeds of t_cluster, in {_T}"),
        "clusters_mean": Meta("1", "mean clusters at the depth", "mean over seeds of clusters_depth"),
        "rel_gap": Meta("1", "relative gap to the closed form", "equiangular starts: median t_cluster over "
                        "the closed-form time, minus 1"),
        "late_t2": Meta("1", "epsilon t^2 at the horizon", "epsilon t^2 at the last sample above "
                        "round-off (equiangular starts): constant for Pre-LN"),
    },
    "orthogonality": {
        "base_monotone": Meta("1", "orthogonal heads monotone",
                              "per configuration (cell, seed, sample up to T_eps, geometry): 1 where every "
                              "orthogonal head's energy rate is >= 0 there, else 0; NaN outside the window"),
        "monotone": Meta("1", "monotone with the overlap",
                         "per configuration where the orthogonal heads are monotone: 1 where the perturbed "
                         "heads are too, else 0; NaN elsewhere"),
        "certified": Meta("1", "certified by the sufficient condition",
                          "per configuration where the orthogonal heads are monotone: 1 where Thm 39's "
                          "sufficient condition, with the actual |u|, holds at the run's overlap omega"),
        "predicted_omega": Meta("1", "predicted critical overlap",
                                "the margin's prediction min_h margin_h / sum_i |u^h_i| sum_h' |u^h'_i| at "
                                "the orthogonal heads, per configuration"),
        "critical_omega": Meta("1", "critical overlap",
                               "the overlap omega at which the first head stops being monotone along the "
                               "run's own perturbation direction (inf: none up to the search's end); at a "
                               "subsample of the configurations"),
        "omega": Meta("1", "head overlap omega", "per run: max over head pairs of ||M_h' M_h||_op"),
        "map_survival": Meta("1", "share staying monotone",
                             "share of configurations (pooled over delta, seeds, samples) where the "
                             "orthogonal heads are monotone that stay so with the overlap, per omega bin"),
        "map_certified": Meta("1", "share certified",
                              "share of those configurations the sufficient condition certifies, per "
                              "omega bin"),
        "map_configurations": Meta("1", "configurations per bin",
                                   "number of configurations in the omega bin"),
        "omega_edges": Meta("1", "omega bin edges", "edges of the omega bins of the map"),
        "ratio_survival": Meta("1", "share staying monotone against omega over its prediction",
                               "share of configurations staying monotone, per bin of omega / "
                               "predicted_omega"),
        "ratio_configurations": Meta("1", "configurations per ratio bin",
                                     "number of configurations in the bin of omega / predicted_omega"),
        "ratio_edges": Meta("1", "ratio bin edges", "edges of the bins of omega / predicted_omega"),
        "base_share": Meta("1", "share where the orthogonal heads are monotone",
                           "share of configurations up to T_eps where every orthogonal head is monotone"),
    },
    "trained_heads": {
        "mono_path": Meta("1", "every head monotone up to clustering",
                          "per seed: 1 where every head's energy rate is >= 0 up to t_cluster, else 0"),
        "time_rd": Meta("1", "share of the run inside Radial Dominance",
                        "per seed: fraction of the samples up to t_cluster at which Radial Dominance holds"),
        "strength": Meta("1", "head strength", "head strength lambda_h (operator norm of M_h)"),
        "frac_mono_path": Meta("1", "fraction of seeds monotone up to clustering",
                               "mean over seeds of mono_path"),
        "frac_time_rd": Meta("1", "mean share of the run inside Radial Dominance",
                             "mean over seeds of time_rd"),
        "beta_mono_mean": Meta("1", "threshold in beta of per-head monotonicity",
                               "mean over seeds of the geometric midpoint of each seed's grid bracket"),
        "beta_mono_below_grid": Meta("1", "fraction of seeds below the grid",
                                     "fraction of the seeds placed failing at the smallest beta"),
        "beta_mono_above_grid": Meta("1", "fraction of seeds above the grid",
                                     "fraction of the seeds placed holding at every beta through the "
                                     "largest"),
        "beta_mono_undetermined": Meta("1", "seeds not placed", UNDETERMINED),
        "principal_angle": Meta("degree", "principal angle between heads",
                                "principal angles between the heads' score subspaces"),
        "cross_norm": Meta("1", "head overlap", "||M_h' M_h||_op for each pair of heads of the layer"),
    },
    "variants": {
        "frac_total_monotone": Meta("1", "fraction of runs with total energy monotone",
                                    "fraction of seeds whose total energy rate is >= 0 at every sample"),
        "energy_residual": Meta("1", "energy identity residual",
                                "max over seeds and samples of |sum_h dE_h/dt - kinetic| / max kinetic"),
        "energy_residual_bound": Meta("1", "round-off bound of the residual",
                                      "largest over seeds of the float64 round-off bound (n + d) eps R of "
                                      "the residual, R the radial-to-tangential ratio of the heads' outputs"),
        "energy_residual_excess": Meta("1", "residual over its round-off bound",
                                       "largest over seeds of energy_residual / energy_residual_bound (<= 1: "
                                       "the identity holds to round-off)"),
        "frac_heads_monotone": Meta("1", "fraction of runs with every head monotone",
                                    "fraction of seeds with every head's energy rate >= 0 at every sample "
                                    "and every accepted integration step (the attrs' monotone_judged)"),
        "t_cluster_median": Meta(TIME_UNITS, "median clustering time",
                                 f"median over seeds, in {_T}; +inf where most runs are censored"),
        "frac_censored": Meta("1", "fraction of runs censored", "fraction of seeds not clustered by t_max"),
        "distance_from_token0": Meta("1", "distance from token 0's start",
                                     "median over seeds of the largest distance at t_max from token 0's "
                                     "initial position"),
    },
}
