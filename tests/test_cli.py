"""The command line: help, version, and the demo on the CPU interpreter."""

from __future__ import annotations

from typer.testing import CliRunner

from epilab.cli import app

runner = CliRunner()


def test_help_lists_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "demo" in result.output and "version" in result.output


def test_version():
    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0 and "epilab 0.1.0" in result.output and "triton" in result.output


def test_demo_runs_and_checks_against_float64():
    result = runner.invoke(app, ["demo", "--m", "33", "--n", "47", "--k", "29", "--dtype", "float32"])
    assert result.exit_code == 0, result.output
    assert "OK" in result.output and "33x47x29 float32" in result.output


def test_demo_rejects_bad_options():
    result = runner.invoke(app, ["demo", "--dtype", "int8"])
    assert result.exit_code == 2 and "not one of" in result.output
    result = runner.invoke(app, ["demo", "--m", "0"])
    assert result.exit_code == 2 and "must be positive" in result.output
