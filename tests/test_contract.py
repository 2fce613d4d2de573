"""The one contract between ``simulate`` and an engine (``attnflow.contract``): its options, and the one
check by which each engine implements every declaration or refuses it by name."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest
import reference
from reference import random_sphere, random_symmetric

from attnflow import Cell, engine, engines, jaxengine, simulate, simulation
from attnflow.attention import ATTENTIONS, MASKS, Mask
from attnflow.cell import ENGINES
from attnflow.contract import (
    ClusterEvent,
    Controller,
    Heads,
    Problem,
    SaveAt,
    check_engine,
    declarations,
)
from attnflow.geometry import GEOMETRIES, Geometry, Motion
from attnflow.heads import Form
from attnflow.observables import CLUSTER_METRICS, GROUPS, ClusterMetric, ObservableGroup

_HAS_JAX = all(importlib.util.find_spec(name) for name in ("jax", "diffrax", "equinox", "optimistix"))


def _engines():
    """(name, that engine's check of its declarations, its tables): numba, and jax where installed."""
    found = [("numba", engine.check_declarations, lambda: engine.KERNELS)]
    if _HAS_JAX:
        found.append(("jax", jaxengine.check_declarations, jaxengine.kernels))
    return found


def test_each_engine_has_one_table_per_kind_keyed_by_exactly_the_declared_values():
    # The dispatch tables are the engines' only dispatch over declarations: equal key sets mean no value
    # falls into another's entry, and no entry is left that nothing declares.
    for name, check, tables in _engines():
        check()
        kernels = tables()
        assert set(kernels) == set(declarations()), name
        for kind, values in declarations().items():
            assert set(kernels[kind]) == set(values), (name, kind)


# A fake declaration of each kind the registries hold, and the name each engine must refuse it by.
_FAKES = {
    "observable group": (GROUPS, ObservableGroup("spectrum", (), False, False, "a group with no kernel"),
                         "engine '{engine}' has no observable group kernel for 'spectrum'"),
    "clustering metric": (CLUSTER_METRICS, ClusterMetric("median", "median cosine", ">=", (-1.0, 1.0), "?"),
                          "engine '{engine}' has no clustering metric kernel for 'median'"),
    "attention": (ATTENTIONS, dataclasses.replace(ATTENTIONS.get("softmax"), name="tanh", weights=7),
                  "attention 'tanh' declares int rule 7, which has no kernel in engine '{engine}'"),
    "mask": (MASKS, Mask("window", 5, "a sliding window"),
             "mask 'window' declares int rule 5, which has no kernel in engine '{engine}'"),
    "geometry": (GEOMETRIES, Geometry("torus", 9, False, False, "", "a geometry with no kernel"),
                 "geometry 'torus' declares int rule 9, which has no kernel in engine '{engine}'"),
}


@pytest.mark.parametrize("kind", list(_FAKES))
def test_a_declaration_without_its_kernel_is_refused_by_name_by_each_engine(monkeypatch, kind):
    registry, fake, message = _FAKES[kind]
    monkeypatch.setitem(registry._items, fake.name, fake)
    for name, check, _ in _engines():
        with pytest.raises(NotImplementedError, match=message.format(engine=name)):
            check()


def test_a_geometry_whose_rule_lost_its_kernel_is_refused_at_solve(monkeypatch):
    # The check runs at every solve too, not only at import: a table edited since is caught there.
    monkeypatch.delitem(engine.KERNELS["motion rule"], Motion.UNIT)
    problem = Problem(np.eye(2)[None], Heads(diagonal=np.ones((1, 1, 2))), "softmax", 1.0, "peri_ln")
    with pytest.raises(NotImplementedError, match="geometry 'peri_ln' declares Motion rule <Motion.UNIT: 2>, "
                                                  "which has no kernel in engine 'numba'"):
        engine.solve(problem, Controller(1e-6, 1e-9, 100), SaveAt([0.0, 1.0]))


def test_a_kernel_nothing_declares_is_refused_by_name(monkeypatch):
    monkeypatch.setitem(engine.KERNELS["observable group"], "spectrum", None)
    with pytest.raises(NotImplementedError, match="engine 'numba' has a kernel for observable group "
                                                  "'spectrum', which is not declared"):
        engine.check_declarations()
    with pytest.raises(NotImplementedError, match=r"engine 'toy' has tables for \['weight rule'\]"):
        check_engine("toy", {"weight rule": {}})


def test_the_python_side_tables_are_keyed_by_every_declared_value():
    # No default branch on the Python side either: what a store keeps of each head form, the JAX
    # engine's arrays of each form, the engine each Cell.engine choice resolves to, and the test
    # oracle's rules, each one entry per declared value.
    assert set(simulation._STORED_HEADS) == set(Form)
    assert set(engines._CHOICES) == set(ENGINES)
    assert set(engines.SOLVERS) == set(ENGINES) - {"auto"}
    assert set(jaxengine.HEAD_ARRAYS) == set(Form)
    assert set(reference.WEIGHTS) == set(reference.AVERAGED) == set(ATTENTIONS.names())
    assert set(reference.MASK_RULES) == set(MASKS.names())
    assert set(reference.MOTIONS) == set(GEOMETRIES.names())
    assert set(reference.SPEEDS) == set(GEOMETRIES.names()) - {"flat"}  # flat is no sphere flow
    with pytest.raises(NotImplementedError, match="reference: attention 'tanh' has no oracle"):
        reference.velocity(np.eye(2), np.eye(2)[None], 1.0, "tanh")


def test_the_options_refuse_bad_values_naming_them():
    with pytest.raises(ValueError, match=r"^rtol = 2, atol = 1e-09: need 0 < rtol < 1"):
        Controller(2, 1e-9, 10)
    with pytest.raises(ValueError, match=r"^max_steps = 0"):
        Controller(1e-6, 1e-9, 0)
    with pytest.raises(ValueError, match=r"^fixed_step = -0.1"):
        Controller(1, 1, 10, fixed_step=-0.1)
    with pytest.raises(ValueError, match=r"^SaveAt.times: needs at least two strictly increasing times"):
        SaveAt([1.0, 0.0])
    with pytest.raises(ValueError, match="observables = 'spectrum': unknown"):
        SaveAt([0.0, 1.0], ("spectrum",))
    with pytest.raises(ValueError, match=r"^cluster_metric: 'median', expected one of epsilon, gamma_mean"):
        ClusterEvent("median")
    with pytest.raises(ValueError, match="give the score matrices in exactly one form"):
        Heads(np.eye(2)[None, None], diagonal=np.ones((1, 1, 2)))
    with pytest.raises(ValueError, match="attention = 'tanh': unknown"):
        Problem(np.ones((1, 2, 2)), Heads(np.eye(2)[None, None]), "tanh", 1.0)
    with pytest.raises(ValueError, match=r"^geometry = True: unknown"):
        Problem(np.ones((1, 2, 2)), Heads(np.eye(2)[None, None]), "softmax", 1.0, geometry=True)


def test_a_problem_of_some_trajectories_is_those_rows(rng):
    x0 = np.stack([random_sphere(rng, 3, 4) for _ in range(3)])
    per_seed = np.stack([random_symmetric(rng, 2, 4) for _ in range(3)])
    u = np.linalg.qr(rng.standard_normal((3, 2, 4, 4)))[0][..., :2]
    for heads in (Heads(per_seed, values=per_seed[:1]), Heads(factors=(u, np.ones((1, 2, 2))))):
        problem = Problem(x0, heads, "softmax", np.array([1.0, 2.0, 3.0]))
        part = problem.rows(np.array([0, 2]))
        assert np.array_equal(part.x0, x0[[0, 2]]) and np.array_equal(part.beta, [1.0, 3.0])
        given, kept = heads.given, part.heads.given
        assert np.array_equal(kept, given[[0, 2]] if given.shape[0] > 1 else given)
        if heads.values is not None:
            assert part.heads.values is heads.values  # shared: as it is
        if heads.factors is not None:
            assert np.array_equal(part.heads.factors[0], u[[0, 2]])
    assert problem.attention is ATTENTIONS.get("softmax") and problem.mask is MASKS.get("none")


def test_every_store_names_the_engine_that_computed_it():
    cell = Cell(H=1, n=3, d=2, seeds=1, t_max=0.5, n_samples=2)
    ds = simulate(cell, certify=False)
    assert ds.attrs["engine"] == engines.engine_for(cell) == "numba"
    assert "solver_engine" not in ds.attrs
