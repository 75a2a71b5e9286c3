"""The report's templates are compiled once per machine (tracediag/reports/templating.py): a second process loads the
compiled code from the user's cache instead of compiling; a damaged, foreign or unusable cache is no cache, and the
page is the same either way."""

from __future__ import annotations

import os
import subprocess
import sys

import jinja2
import pytest

from tracediag.reports import templating

# A fresh interpreter renders the report of a real sample and says how many templates it compiled.
RENDER = """
import jinja2, sys
compiled = []
real = jinja2.Environment._compile
def counting(self, source, filename):
    compiled.append(filename)
    return real(self, source, filename)
jinja2.Environment._compile = counting
from tracediag.analysis import analyze
from tracediag.reports.html import render_html
html = render_html(analyze([sys.argv[1]]))
print(len(compiled))
sys.stdout.write(html.split("<footer>", 1)[0])  # the footer holds the minute it was made
"""


def _render(sample, cache_dir) -> tuple[int, str]:
    env = dict(os.environ, TRACEDIAG_CACHE_DIR=str(cache_dir))
    out = subprocess.run(
        [sys.executable, "-c", RENDER, str(sample)], env=env, capture_output=True, text=True, check=True
    ).stdout
    count, _, page = out.partition("\n")
    return int(count), page


@pytest.fixture()
def sample():
    from conftest import SAMPLES

    return SAMPLES / "healthy_tp2"


def test_a_second_run_loads_the_compiled_templates(sample, tmp_path):
    first, page = _render(sample, tmp_path)
    assert first >= 4  # report.html and the templates it includes
    assert len(list((tmp_path / "templates").glob("__jinja2_*.cache"))) == first
    second, again = _render(sample, tmp_path)
    assert second == 0 and again == page


def test_a_damaged_cache_is_compiled_again(sample, tmp_path):
    _, page = _render(sample, tmp_path)
    for f in (tmp_path / "templates").iterdir():
        f.write_bytes(b"j2\x00not a cache")
    count, again = _render(sample, tmp_path)
    assert count >= 4 and again == page


def test_a_cache_folder_others_can_write_is_not_used(tmp_path, monkeypatch):
    folder = tmp_path / "templates"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)  # group- and world-writable: its files could hold anyone's code
    monkeypatch.setenv("TRACEDIAG_CACHE_DIR", str(tmp_path))
    assert templating.cache_dir() is None


def test_an_unusable_cache_location_renders_without_a_cache(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TRACEDIAG_CACHE_DIR", str(blocker))
    assert templating.cache_dir() is None
    templating.environment.cache_clear()
    try:
        env = templating.environment()
        assert env.bytecode_cache is None
        assert env.get_template("report.html") is not None
    finally:
        templating.environment.cache_clear()


def test_the_cache_follows_the_environment_variables(tmp_path, monkeypatch):
    monkeypatch.delenv("TRACEDIAG_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert templating.cache_dir() == tmp_path / "xdg" / "tracediag" / "templates"
    assert oct((tmp_path / "xdg" / "tracediag" / "templates").stat().st_mode & 0o777) == oct(0o700)
    assert isinstance(templating._QuietCache(str(tmp_path)), jinja2.FileSystemBytecodeCache)
