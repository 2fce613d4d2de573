"""Raising ``max_steps``, as a failure's remedy says, recomputes the cells that failed and no other: a
run its budget never stopped takes the same steps under a larger one."""

import dataclasses

import numpy as np

from attnflow import Cell
from attnflow.ids import cell_id
from attnflow.layout import Layout
from attnflow.run.batch import run_batch
from attnflow.run.stored import stored_cells
from attnflow.simulation import simulate


def test_raising_max_steps_recomputes_only_the_cells_that_failed(tmp_path):
    # usa at beta = 0.5 needs a few dozen steps; at beta = 16 it exhausts a budget of 500 (both seeds).
    good = Cell(H=2, n=4, d=4, beta=0.5, attention="usa", heads="block", seeds=2, t_max=1.0, max_steps=500)
    bad = Cell(H=2, n=4, d=4, beta=16.0, attention="usa", heads="block", seeds=2, t_max=4.0, max_steps=500)
    layout = Layout(tmp_path)
    first = run_batch([good, bad], "b", layout, log=lambda line: None)
    assert cell_id(bad) in first.seed_failures and cell_id(good) not in first.seed_failures
    raised = [dataclasses.replace(c, max_steps=800) for c in (good, bad)]
    logs = []
    run_batch(raised, "b", layout, log=logs.append)
    assert logs[0].startswith("[1/2]") and "its run under max_steps = 500 never reached it" in logs[0]
    assert logs[1].startswith("[2/2]") and "computed in" in logs[1]  # the failed one, computed again
    held = stored_cells(layout.store("b"))
    assert {cell_id(c) for c in raised} <= set(held)  # (the store may keep the old ids too, off the grid)
    taken = held[cell_id(raised[0])]
    assert taken.attrs["cell_max_steps"] == 800 and taken.attrs["cell_id"] == cell_id(raised[0])
    # What was taken is what computing under the raised budget gives (the independent route), bit for bit:
    # the same steps, so the same numbers.
    fresh = simulate(raised[0])
    for name, var in fresh.data_vars.items():
        np.testing.assert_array_equal(taken[name].values, var.values, err_msg=name)
    # A lowered budget is not "never reached" (the stored run may need more steps): computed.
    lowered = [dataclasses.replace(good, max_steps=400)]
    logs.clear()
    run_batch(lowered, "b", layout, log=logs.append)
    assert "computed in" in logs[0]
