"""The sufficient condition the orthogonality figure draws (Thm 39's form) never claims a run it loses."""

import numpy as np
import pytest
import xarray as xr

from attnflow import Cell, simulate
from attnflow.experiments._common import all_heads_monotone, before_cluster
from attnflow.experiments.orthogonality import EXPERIMENT, critical_overlap, cross_norms
from attnflow.pack import group_cells


@pytest.mark.parametrize("delta, beta", [(0.0, 0.5), (0.05, 0.25), (0.25, 1.0)])
def test_runs_meeting_the_condition_are_monotone(delta, beta):
    cell = Cell(heads="perturbed_block", attention="usa", init="orthogonal", H=2, n=6, d=6, delta=delta,
                beta=beta, seeds=6, t_max=8.0, n_samples=33, observables=list(EXPERIMENT.observables))
    ds = group_cells({"run": simulate(cell, certify=False)})["g0"]  # as the aggregation reads it
    omega = xr.DataArray(cross_norms(np.asarray(ds.score_matrix.values)), dims=("cell", "seed"))
    holds = (critical_overlap(ds) >= omega).values
    monotone = (all_heads_monotone(ds) | ~before_cluster(ds)).all("time").values
    assert not np.any(holds & ~monotone)  # sufficient: never holds where a head's energy fell
    if delta == 0.0:
        # Exactly orthogonal heads at orthogonal tokens: omega = 0 and the margins are >= 0.
        assert np.all(omega.values == 0.0) and holds.all() and monotone.all()
