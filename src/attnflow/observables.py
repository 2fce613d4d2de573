"""Observables of docs/model.md: what a simulation can record, grouped by what computing them costs.

Each group is one declaration; a cell's ``observables`` field names the groups
its experiment needs, and the compiled engine computes only those
(``engine/measure.py``). ``cosines`` is always recorded: the clustering
criterion reads it. Groups marked ``needs_velocity`` evaluate the attention
field at every sample (about one right-hand side each), and those marked
``needs_scores`` keep its raw scores; the others only read the positions. The
engine reads both flags from here. Each variable declares its CF units (every
quantity of the model is dimensionless: ``"1"``, rates per unit of the flow's
dimensionless time included; ``attnflow.units``), long name and description,
which every store keeps.
"""

from __future__ import annotations

import dataclasses

from .attention import AttentionType, Energy, Entropy
from .registry import Registry
from .units import RATE


@dataclasses.dataclass(frozen=True)
class Variable:
    name: str
    dims: tuple[str, ...]  # after ("seed", "time")
    units: str  # CF: "1" for a dimensionless quantity
    long_name: str
    description: str | dict  # or, where the attention type's energy or entropy decides, one per rule
    dtype: str = "float64"
    # Whether the accuracy certificate compares it between the run and its companion: not a value at
    # given times (the least over the integrator's own steps moves with the steps, not with the error)
    certified: bool = True

    def attrs(self, attention: AttentionType) -> dict[str, str]:
        """The attributes a store gives the variable, for stores of ``attention``."""
        return {"units": self.units, "long_name": self.long_name, "description": self.describe(attention)}

    def describe(self, attention: AttentionType) -> str:
        """The description, for stores of ``attention`` (its declared energy or entropy rule)."""
        if isinstance(self.description, str):
            return self.description
        rule = attention.energy if isinstance(next(iter(self.description)), Energy) else attention.entropy
        if rule not in self.description:
            raise NotImplementedError(f"variable {self.name!r} has no description for {rule!r}")
        return self.description[rule]


@dataclasses.dataclass(frozen=True)
class ObservableGroup:
    name: str
    variables: tuple[Variable, ...]
    needs_velocity: bool  # the field is evaluated at every sample
    needs_scores: bool  # that evaluation keeps the raw scores s^h_ij
    description: str
    requires: tuple[str, ...] = ()  # groups recorded with it (canonical_groups adds them)


GROUPS: Registry[ObservableGroup] = Registry("observables", [
    ObservableGroup("cosines", (
        Variable("gamma_mean", (), "1", "mean pairwise cosine", "mean pairwise cosine <x_i, x_j>, i < j"),
        Variable("gamma_min", (), "1", "minimum pairwise cosine",
                 "minimum pairwise cosine <x_i, x_j>, i < j"),
    ), False, False, "pairwise cosines (always recorded; the clustering criterion reads them)"),
    ObservableGroup("clusters", (
        Variable("cluster_count", (), "1", "number of clusters",
                 "connected components of the graph with an edge where <x_i, x_j> >= 1 - cluster_eps",
                 "int32"),
    ), False, False, "number of clusters (metastable multi-cluster states show as plateaus)"),
    ObservableGroup("velocity", (
        Variable("kinetic", (), "1", "kinetic term", f"(1/n) sum_i ||dx_i/dt||^2, dx_i/dt {RATE}"),
        Variable("gamma_mean_rate", (), "1", "rate of the mean pairwise cosine",
                 f"exact d gamma_mean / dt from the velocities, {RATE}"),
    ), True, False, "kinetic term and the exact rate of the mean cosine"),
    ObservableGroup("energy", (
        Variable("energy", ("head",), "1", "per-head energy", {
            Energy.EXP: "per-head energy E_h = sum_ij exp(beta s^h_ij) / (2 beta n^2)",
            Energy.SOFTPLUS: "per-head energy E_h = sum_ij softplus(beta s^h_ij - log n) / (2 beta n)"}),
        Variable("energy_rate", ("head",), "1", "per-head energy rate", {
            Energy.EXP: "exact dE_h/dt = (1/n^2) sum_i <dx_i/dt, g^h_i>, "
                        f"g^h_i = sum_j exp(beta s^h_ij) M_h x_j, {RATE}",
            Energy.SOFTPLUS: "exact dE_h/dt = (1/n) sum_i <dx_i/dt, g^h_i>, "
                             f"g^h_i = sum_j sigma(beta s^h_ij - log n) M_h x_j, {RATE}"}),
    ), True, True, "per-head energies and their exact rates (Thm 11, 16-17, 39); the identities that tie "
       "them to the kinetic term hold only with values: aligned (V_h = M_h), symmetric heads and no mask"),
    ObservableGroup("radial", (
        Variable("radial_shadow", ("head", "token"), "1", "radial shadow", "a^h_i = <f^h_i, x_i>"),
        Variable("tangential_power", ("head", "token"), "1", "tangential power",
                 "T^h_i = ||P_{x_i} f^h_i||^2"),
        Variable("rd_margin", ("head", "token"), "1", "Radial Dominance margin",
                 "Radial Dominance margin T^h_i - a^h_i sum_{h'!=h} a^h'_i (>= 0: Condition 8 holds)"),
        Variable("rd_margin_sufficient", ("head", "token"), "1", "sufficient Radial Dominance margin",
                 "sufficient margin T^h_i - (H-1) |a^h_i| max_{h'!=h} ||f^h'_i|| (Thm 19)"),
    ), True, False, "radial shadows and Radial Dominance margins (Thm 16-19)"),
    ObservableGroup("entropy", (
        Variable("entropy", ("head", "token"), "1", "attention entropy (nats)", {
            Entropy.SOFTMAX: "attention entropy of softmax_j(beta s^h_ij) (over j <= i under a causal mask), "
                             "natural logarithm",
            Entropy.SIGMOID: "entropy of the row-normalised weights sigma(beta s^h_ij - log n) (over j <= i "
                             "under a causal mask), natural logarithm"}),
        Variable("entropy_rate", ("head", "token"), "1", "attention entropy rate (nats)", {
            Entropy.SOFTMAX: f"Thm 27: -beta^2 Cov_p(s_ij, ds_ij/dt), exact, {RATE}",
            Entropy.SIGMOID: f"-Cov_p(l_j, dl_j/dt), l_j = log sigma(beta s_ij - log n), exact, {RATE}"}),
    ), True, True, "attention entropy and its exact rate (Thm 27)"),
    ObservableGroup("positions", (
        Variable("x", ("token", "dim"), "1", "token positions",
                 "token positions x_i (the directions theta_i = x_i / ||x_i|| where the geometry carries "
                 "radii)"),
    ), False, False, "the token positions themselves"),
    # Monotonicity judged on the whole trajectory, not only at the samples (issue 52): the engines
    # evaluate the field and the per-head rates again at the end of every accepted step (one right-hand
    # side a step), and keep per sample the least since the previous one.
    ObservableGroup("energy_path", (
        Variable("energy_rate_min", ("head",), "1", "least per-head energy rate since the previous sample",
                 "least dE_h/dt (as energy_rate) over this sample and the end of every accepted "
                 "integration step since the previous sample: a dip of a head's energy between samples "
                 f"shows here, {RATE}; taken at the integrator's own steps, so outside the accuracy "
                 "certificate",
                 certified=False),
    ), True, True, "the least per-head energy rate over every accepted step, per sample interval "
                   "(per-head monotonicity on the whole trajectory)", requires=("energy",)),
    ObservableGroup("radius", (
        Variable("radius", ("token",), "1", "token radius",
                 "r_i = ||x_i||: 1 on the sphere, growing from 1 under pre_ln and peri_ln"),
        Variable("radius_mean", (), "1", "mean token radius", "mean over the tokens of r_i = ||x_i||"),
        # Left out of the certificate: from equiangular starts the spread is 0 up to round-off, which
        # relative to its own scale reads as error; |std(r) - std(r')| <= max |r - r'|, so the certified
        # radii bound its error (in units of the radii).
        Variable("radius_spread", (), "1", "spread of the token radii",
                 "standard deviation over the tokens of r_i = ||x_i||; its error is at most the radii's "
                 "(certified through radius, not on its own scale)", certified=False),
    ), False, False, "the token radii r_i = ||x_i|| (the state of pre_ln and peri_ln; every other group "
       "reads the directions x_i / r_i there)"),
])



@dataclasses.dataclass(frozen=True)
class ClusterMetric:
    """A clustering criterion (``Cell.cluster_metric``): ``quantity comparison threshold`` holds from the
    first time ``t_cluster`` on. Each engine implements each metric (``attnflow.contract``)."""

    name: str
    quantity: str  # what is compared, in words
    comparison: str  # "<=" or ">=": how the quantity meets its threshold
    bounds: tuple[float, float]  # the open interval the quantity, hence a useful threshold, lies in
    description: str

    def text(self, threshold: float) -> str:
        """The criterion in words, as ``epsilon <= 0.001``."""
        return f"{self.name} {self.comparison} {threshold:g}"


CLUSTER_METRICS: Registry[ClusterMetric] = Registry("cluster_metric", [
    ClusterMetric("epsilon", "epsilon = 1 - gamma_min", "<=", (0.0, 2.0),
                  "epsilon = 1 - gamma_min <= cluster_threshold (every pair within)"),
    ClusterMetric("gamma_mean", "gamma_mean", ">=", (-1.0, 1.0),
                  "mean pairwise cosine gamma_mean >= cluster_threshold"),
])

DEFAULT_GROUPS = ("cosines", "clusters", "velocity", "energy", "radial", "entropy")


def canonical_groups(names) -> tuple[str, ...]:
    """Known group names in declaration order, ``cosines`` included; ``ValueError`` for an unknown one."""
    wanted = {GROUPS.get(name).name for name in names} | {"cosines"}
    wanted |= {r for g in list(wanted) for r in GROUPS.get(g).requires}
    return tuple(g for g in GROUPS.names() if g in wanted)


def variables(groups) -> tuple[Variable, ...]:
    """The stored per-sample variables of ``groups``."""
    return tuple(v for g in canonical_groups(groups) for v in GROUPS.get(g).variables)
