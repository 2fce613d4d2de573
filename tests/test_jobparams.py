"""Job parameters in files named by their digest (attnflow.jobparams): what rules pass instead of cells."""

import pytest

from attnflow import jobparams
from attnflow.layout import Layout


def test_the_same_text_is_one_file_and_another_text_another(tmp_path):
    layout = Layout(tmp_path / "results")
    first = jobparams.put(layout, '[{"beta": 0.5}]')
    assert jobparams.put(layout, '[{"beta": 0.5}]') == first  # a second parse names the same file
    other = jobparams.put(layout, '[{"beta": 0.5}, {"beta": 8.0}]')
    assert other != first and len(other) == len(first) == 16
    assert jobparams.get(layout, first) == '[{"beta": 0.5}]'
    assert jobparams.get(layout, other) == '[{"beta": 0.5}, {"beta": 8.0}]'
    folder = layout.job_params(first).parent
    assert sorted(p.name for p in folder.iterdir()) == sorted([f"{first}.json", f"{other}.json"])  # no temp


def test_a_missing_or_edited_file_is_named(tmp_path):
    layout = Layout(tmp_path / "results")
    key = jobparams.put(layout, "[1, 2]")
    layout.job_params(key).write_text("[1, 3]")
    with pytest.raises(ValueError, match=f"{key}.json do not match their digest"):
        jobparams.get(layout, key)
    with pytest.raises(FileNotFoundError, match="0123456789abcdef.json are missing.*run `snakemake` again"):
        jobparams.get(layout, "0123456789abcdef")


def test_an_edited_file_is_written_again_by_the_next_run(tmp_path):
    # Before, put kept any file of the right name: one edited by hand failed every later job until deleted.
    layout = Layout(tmp_path / "results")
    key = jobparams.put(layout, "[1, 2]")
    for edit in ("[1, 3]", "[1, 2, 3]", ""):  # the same size, another size, emptied
        layout.job_params(key).write_text(edit)
        assert jobparams.put(layout, "[1, 2]", write=False) == key  # a dry run writes nothing
        assert layout.job_params(key).read_text() == edit
        assert jobparams.put(layout, "[1, 2]") == key
        assert jobparams.get(layout, key) == "[1, 2]"
