"""The package as users install it: build the wheel and the sdist from a copy of the checkout, install the
wheel (not editable) into a fresh virtual environment outside the checkout, and run `tracediag analyze` and
`tracediag check --junit` from an empty working directory.

The fresh environment gets tracediag only from the wheel; its third-party dependencies are borrowed from the
environment running the tests (a `.pth` line naming that site-packages), so the test needs no network. A
`.pth` line adds a folder to sys.path without processing the `.pth` files inside it, so the editable
install of the checkout is not visible there (asserted below).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, SAMPLES

HEALTHY = SAMPLES / "healthy_tp2"


def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [f for f in out.decode().split("\0") if f and (REPO / f).is_file()]


def _runtime_files() -> set[str]:
    """Every file the package reads at run time: the non-Python files under tracediag/ (SQL, JSON, templates)."""
    files = {f for f in _tracked_files() if f.startswith("tracediag/") and not f.endswith(".py")}
    assert {"tracediag/reports/templates/sections/_generic.html", "tracediag/store/schema.sql"} <= files
    return files


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """Wheel and sdist built from a copy of the tracked files (the checkout gets no build/ or egg-info)."""
    src = tmp_path_factory.mktemp("src")
    for f in _tracked_files():
        if f.startswith(("tracediag/", "LICENSE", "README.md", "pyproject.toml")):
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, src / f)
    dist = tmp_path_factory.mktemp("dist")
    built: dict[str, Path] = {}
    for kind in ("wheel", "sdist"):  # one process per PEP 517 hook, as a build frontend runs them
        hook = f"import sys; from setuptools import build_meta as b; print('BUILT', b.build_{kind}(sys.argv[1]))"
        r = subprocess.run(
            [sys.executable, "-c", hook, str(dist)], cwd=src, capture_output=True, text=True, timeout=600
        )
        assert r.returncode == 0, r.stdout + r.stderr
        line = next(line for line in r.stdout.splitlines() if line.startswith("BUILT "))
        built[kind] = dist / line.split()[1]
        assert built[kind].is_file(), r.stdout
    return built


def test_wheel_and_sdist_carry_every_runtime_file(built):
    names = set(zipfile.ZipFile(built["wheel"]).namelist())
    assert _runtime_files() - names == set()
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(built["wheel"]).read(meta).decode()
    from tracediag import __version__

    for field in (
        "Requires-Python: >=3.11",
        f"Version: {__version__}",
        "License-Expression: Apache-2.0",
        "License-File: LICENSE",
        "Project-URL: Homepage",
        "Classifier: Programming Language :: Python :: 3",
        "Description-Content-Type: text/markdown",
    ):
        assert field in text, field
    with tarfile.open(built["sdist"]) as tar:
        top = tar.getnames()[0].split("/")[0]
        in_sdist = {n.removeprefix(top + "/") for n in tar.getnames()}
    assert _runtime_files() - in_sdist == set()
    assert {"LICENSE", "README.md", "pyproject.toml"} <= in_sdist


@pytest.fixture(scope="module")
def fresh_venv(built, tmp_path_factory) -> Path:
    """A new virtual environment outside the checkout with the wheel installed (no deps from the network)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    (Path(site) / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    r = subprocess.run(
        [py, "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(built["wheel"])],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return venv


def _run(venv: Path, *args, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(list(map(str, args)), capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def test_installed_wheel_is_what_runs(fresh_venv, tmp_path):
    r = _run(
        fresh_venv, fresh_venv / "bin" / "python", "-c", "import tracediag; print(tracediag.__file__)", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).resolve().is_relative_to(fresh_venv.resolve()), r.stdout


def test_installed_wheel_analyzes_and_checks(fresh_venv, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    tracediag = fresh_venv / "bin" / "tracediag"
    r = _run(fresh_venv, tracediag, "analyze", HEALTHY, "--model", HEALTHY / "config.json", "-o", "out", cwd=work)
    assert r.returncode == 0, r.stdout + r.stderr
    out = work / "out"
    assert sorted(p.name for p in out.iterdir()) == ["findings.json", "report.html", "trace.duckdb"]
    html = (out / "report.html").read_text()
    assert html.lower().startswith("<!doctype html>") and "COL001" in html and "</html>" in html
    doc = json.loads((out / "findings.json").read_text())
    assert doc["schema"] == "tracediag/findings-v1" and len(doc["checks"]) >= 27

    r = _run(
        fresh_venv,
        tracediag,
        "check",
        HEALTHY,
        "-m",
        HEALTHY / "config.json",
        "--junit",
        "rules.xml",
        "-o",
        "checked",
        cwd=work,
    )
    assert r.returncode in (0, 1), r.stdout + r.stderr
    assert (work / "rules.xml").read_text().lstrip().startswith("<?xml")
    assert (work / "checked" / "check.json").is_file() and (work / "checked" / "report.html").is_file()

    for args in (["--version"], ["-h"]):
        r = _run(fresh_venv, fresh_venv / "bin" / "python", "-m", "tracediag", *args, cwd=work)
        assert r.returncode == 0, r.stderr
