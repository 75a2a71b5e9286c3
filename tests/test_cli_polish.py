"""What a user sees of the CLI besides the analysis: -h, --version, python -m, help without type labels,
an example per command, and output files written with the user's umask (like any other tool)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys

import pytest
from conftest import SAMPLES

from tracediag import __version__
from tracediag.cli.commands import COMMAND_MODULES

HEALTHY = SAMPLES / "healthy_tp2"
COMMANDS = [m.rsplit(".", 1)[1] for m in COMMAND_MODULES]


def tracediag(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tracediag", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env=env,
    )


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_flag(flag):
    r = tracediag(flag)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"tracediag {__version__}"


def test_version_has_one_source():
    from importlib.metadata import version

    assert version("tracediag") == __version__


@pytest.mark.parametrize("cmd", [None, *COMMANDS])
def test_help_short_and_long_the_same_and_without_type_labels(cmd):
    args = [cmd] if cmd else []
    short, long = tracediag(*args, "-h"), tracediag(*args, "--help")
    assert short.returncode == long.returncode == 0, short.stderr + long.stderr
    assert short.stdout == long.stdout
    text = long.stdout
    # typer's type labels and empty rich-markup brackets must not leak into the help
    assert not re.search(r"<(bool|int|float|str|path|list\[[^]]*\]|int range|float range)>", text), text
    assert "()" not in text and "[x>=" not in text and "<=x" not in text and "{" not in text.split("\n")[0], text
    if cmd:
        assert "Example" in text, f"`tracediag {cmd} --help` has no example"


def test_help_names_option_values():
    text = tracediag("analyze", "--help").stdout
    for opt, metavar in (("--model", "FILE"), ("--tp", "N"), ("--out", "DIR"), ("--slo", "BUDGETS")):
        assert re.search(rf"{opt} {metavar}\b", text), (opt, text)


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_outputs_follow_the_umask(tmp_path):
    """JUnit XML, the annotated trace, check's and analyze's outputs, diff.json and diff.html: 0644 under umask 022."""
    env = {**os.environ}
    script = (
        "import os, sys; os.umask(0o022); from tracediag.cli import main; sys.argv = ['tracediag'] + sys.argv[1:]; "
        "main()"
    )

    def run(*args):
        return subprocess.run(
            [sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, env=env, timeout=300
        )

    out, junit, marked = tmp_path / "out", tmp_path / "rules.xml", tmp_path / "marked.json"
    r = run("check", HEALTHY, "-m", HEALTHY / "config.json", "--junit", junit, "--annotated-trace", marked, "-o", out)
    assert r.returncode in (0, 1), r.stderr
    d = tmp_path / "diff"
    r2 = run("diff", out, out, "-o", d, "-q")
    assert r2.returncode == 0, r2.stderr
    files = [junit, marked, *sorted(out.iterdir()), d / "diff.json", d / "diff.html"]
    assert {f.name: oct(_mode(f)) for f in files} == {f.name: oct(0o644) for f in files}
