"""The points ``attnflow refine`` recorded (``refinement.json``) against the config's grid: a point the
grid no longer holds leaves it, said; a record of another shape is refused naming the file."""

import json
import warnings

import pytest
from sweep_helpers import beta_star_config

from attnflow.access import load_sweep
from attnflow.errors import ConfigError


def _record(tmp_path, points) -> None:
    path = tmp_path / "results" / "refinement.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"experiments": {"beta_star": {"points": points, "rounds": []}}}))


def _coords(sweep):
    return [dict(p.coords) for p in sweep.points["beta_star"]]


REFINED = {"H": 2, "n": 4, "attention": "softmax", "heads": "block", "beta": 1.0}


def test_a_refined_point_leaves_the_grid_with_its_axis_value(tmp_path):
    config = beta_star_config(tmp_path)
    _record(tmp_path, [REFINED])
    assert REFINED in _coords(load_sweep(config))
    # n = 4 removed from the grid: the point refined at n = 4 is left out, and the warning names the file.
    edited = beta_star_config(tmp_path, "edited.yaml", **{"experiments.beta_star.grid.n": [6, 8]})
    with pytest.warns(UserWarning, match=r"refinement\.json: 1 refined points of beta_star lie off its grid"):
        coords = _coords(load_sweep(edited))
    assert all(c["n"] != 4 for c in coords)
    # The refined axis shrunk past the point: out too (a refinement lies between grid values).
    narrowed = beta_star_config(tmp_path, "narrowed.yaml", **{"experiments.beta_star.grid.beta": [2.0, 4.0]})
    with pytest.warns(UserWarning, match="lie off its grid"):
        assert all(c["beta"] >= 2.0 for c in _coords(load_sweep(narrowed)))
    # The value put back: the point is back, no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert REFINED in _coords(load_sweep(config))


@pytest.mark.parametrize("points, match", [
    ({"H": 2, "n": 4, "attention": "softmax", "heads": "block", "beta": 1.0}, "not a list of points"),
    ([REFINED, [2, 4]], r"points\[1\] = \[2, 4\]: not a point"),
])
def test_a_record_of_another_shape_is_refused_naming_the_file(tmp_path, points, match):
    config = beta_star_config(tmp_path)
    _record(tmp_path, points)
    with pytest.raises(ConfigError, match=str(tmp_path / "results" / "refinement.json") + ".*" + match):
        load_sweep(config)


def test_a_refined_point_the_cell_refuses_names_the_file_not_the_config(tmp_path):
    config = beta_star_config(tmp_path)
    _record(tmp_path, [{**REFINED, "beta": True}])  # inside the grid's range as a number, no beta to Cell
    with pytest.raises(ConfigError) as err:
        load_sweep(config)
    assert str(err.value).startswith(str(tmp_path / "results" / "refinement.json") + ": a point attnflow "
                                     "refine recorded for beta_star")
    # The config's own mistakes still name the config's key.
    bad = beta_star_config(tmp_path, "bad.yaml", **{"experiments.beta_star.grid.beta": [-1.0, 2.0]})
    with pytest.raises(ConfigError, match=r"^experiments\.beta_star"):
        load_sweep(bad)
