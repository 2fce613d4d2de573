"""One clear line for what a user gets wrong at the edges: the config's bytes, its results directory,
its scheduler's address, export's destinations, and open_summary called from elsewhere."""

import shutil
import subprocess
import sys

import pytest
from sweep_helpers import beta_star_config

from attnflow.cli import main as attnflow_main
from attnflow.config import check_results, check_scheduler, load
from attnflow.errors import ConfigError

ROOT = beta_star_config.__globals__["ROOT"]


def test_a_config_not_in_utf8_is_one_line_naming_the_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("results: r\n# d\xe9faut\nexperiments: {}\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.yaml: line 2: not UTF-8 text \(byte 0xe9\)"):
        load(path)


def test_the_snakefiles_default_config_not_in_utf8_is_one_line_naming_the_file(tmp_path):
    # Snakemake's own reader stops at such a file with a UnicodeDecodeError naming no file; the Snakefile
    # checks its default config (config/config.yaml in the working directory) before Snakemake reads it.
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_bytes("results: r\n# d\xe9faut\nexperiments: {}\n"
                                                      .encode("latin-1"))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "-n",
                           "--cores", "1"], cwd=tmp_path, capture_output=True, text=True)
    out = proc.stdout + proc.stderr  # Snakemake logs its error to stdout when that is not a terminal
    assert proc.returncode != 0
    assert "invalid config: config/config.yaml: line 2: not UTF-8 text (byte 0xe9)" in out
    assert "UnicodeDecodeError" not in out and "Traceback" not in out


@pytest.mark.parametrize("address", ["tcp://localhost:99999", "tcp://localhost:port", "tcp://localhost:-1"])
def test_a_bad_scheduler_port_is_one_line(address):
    with pytest.raises(ConfigError, match=r"dask_scheduler = .*tcp://host:port \(a port from 1 to 65535\)"):
        check_scheduler(address)


def test_results_in_the_working_copy_itself_or_on_two_lines_is_refused(monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError, match=r"results = '\.': the working copy itself"):
        check_results(".")
    with pytest.raises(ConfigError, match="the working copy itself"):
        check_results(str(ROOT / "config" / ".."))
    with pytest.raises(ConfigError, match="control character"):
        check_results("results/a\nb")
    check_results("results/mine")  # a folder inside it is fine


@pytest.mark.parametrize("json_name", ["F-metadata.json", "./F-metadata.json", "F"])
def test_export_refuses_two_outputs_in_one_file(tmp_path, monkeypatch, capsys, json_name):
    monkeypatch.chdir(tmp_path)
    config = beta_star_config(tmp_path)
    code = attnflow_main(["export", "beta_star", "--configfile", str(config), "--csv", "F",
                          "--json", json_name])
    assert code == 2
    assert "name the same destination" in capsys.readouterr().err
    assert not (tmp_path / "F").exists() and not (tmp_path / "F-metadata.json").exists()


def test_open_summary_from_another_directory_finds_the_run(beta_star_run, tmp_path, monkeypatch):
    import attnflow
    from attnflow.access import NotBuiltError

    # A working copy with its Snakefile; the config's results relative to it, as the README runs it.
    copy = tmp_path / "copy"
    (copy / "config").mkdir(parents=True)
    (copy / "Snakefile").write_text("")
    config = beta_star_config(copy / "config", name="c.yaml", results="results/c")
    summary = copy / "results" / "c" / "summaries" / "beta_star.zarr.zip"
    elsewhere = tmp_path / "notebooks"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    # Not built yet: the message names where it looked, in full.
    with pytest.raises(NotBuiltError, match=f"no summary at {summary} yet"):
        attnflow.open_summary("beta_star", configfile=config)
    shutil.copytree(beta_star_run[2], copy / "results" / "c")  # a run of the same grids, made there
    assert attnflow.open_summary("beta_star", configfile=config).beta.size == 2
