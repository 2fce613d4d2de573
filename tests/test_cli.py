"""The command line's own surface: its version, and help a user reads as plain text, with every option's
default and every experiment argument's choices."""

import re

import pytest

import attnflow
from attnflow.cli import main as attnflow_main
from attnflow.experiments import Experiment, registry

COMMANDS = ["status", "schema", "docs", "refine", "plan", "export"]


def _help(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        attnflow_main([*argv, "--help"])
    assert exit_.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps at the terminal's width


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        attnflow_main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"attnflow {attnflow.__version__}"


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_is_plain_text(command, capsys):
    text = _help(capsys, *filter(None, [command]))
    assert "``" not in text, text  # reST literals
    assert not re.search(r":\w+:`", text), text  # reST roles (:func:, :class:...)
    if command:
        assert text.split(" ")[:3] == ["usage:", "attnflow", command]


@pytest.mark.parametrize("command", ["status", "refine", "plan", "export"])
def test_configfile_is_explained_with_its_default(command, capsys):
    text = _help(capsys, command)
    default = r"\(default: config/config\.yaml\)"
    assert re.search(r"--configfile FILE the sweep config, a YAML file " + default, text), text


def test_experiment_arguments_list_their_choices(capsys):
    experiments = list(registry())
    exporting = [e.name for e in experiments if type(e).export_table is not Experiment.export_table]
    refining = [e.name for e in experiments if e.refine_axis]
    assert "beta_star" in exporting and "beta_star" in refining and "energy" not in exporting
    for command, names in (("export", exporting), ("refine", refining)):
        text = _help(capsys, command)
        listed = re.search(r"EXPERIMENT .*?one of (.*?) \(or one that", text).group(1)
        assert listed.split(", ") == names, (command, listed)


def test_status_summary_names_every_state_it_reports(capsys):
    from attnflow.status import STATES

    text = _help(capsys)  # attnflow --help: the one-line summary of each command
    summary = re.search(r"status (cells .*?) schema", text).group(1)
    assert all(state in summary for state in STATES), (summary, STATES)


def test_docs_help_keeps_its_paths_lowercase(capsys):
    # _command capitalises a summary for the command's own --help; a summary that starts with a path
    # would read "Docs/experiments.md", a file that does not exist on a case-sensitive file system.
    text = _help(capsys, "docs")
    assert "docs/experiments.md and docs/config.md" in text and "Docs/" not in text, text
