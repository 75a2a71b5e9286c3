"""The command line's cheap coercion (tracediag/cli/fastparams.py) gives what typer's own coercion gives: the
same value, or typer's own error, for every option of every command and a range of ordinary and hostile values."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer
import typer.main

from tracediag.cli import app, fastparams

_coercion = pytest.importorskip("typer._coercion")

VALUES = [
    "0", "1", "2", "007", "4096", "4097", "1024", "1025", "-1", "+3", " 5", "5 ", "1_000", "١٢", "99999999999999999999",
    "0.5", "1.", ".5", "0.0001", "0.001", "100000", "100000.0", "100000.01", "1e3", "1E-2", "nan", "inf", "-inf",
    "", "x", "a b", "trace.json", "/tmp", "/nonexistent/x.json", "-", "~", "a\x00b", "é.json", "x" * 5000,
]  # fmt: skip


def _params():
    cmd = typer.main.get_command(app)
    for name, sub in sorted(cmd.commands.items()):
        for p in sub.params:
            if hasattr(p, "type_descriptor"):
                yield name, p


def _outcome(rp, value, param, ctx):
    try:
        return ("ok", rp.coerce(value, param=param, ctx=ctx))
    except typer.BadParameter as exc:
        return ("error", exc.format_message())


def test_fast_coercion_matches_typer():
    fastparams.install()
    checked = fast = 0
    for name, p in _params():
        ctx = typer.main.get_command(app).commands[name].make_context(name, [], resilient_parsing=True)
        reference = _coercion.build_runtime_param(p.type_descriptor)
        ours = p.get_runtime_param()
        fast += type(ours).__name__ == "_Plain"
        multi = p.multiple or p.nargs == -1
        for v in [*VALUES, None, True, False]:
            value = (v,) if multi and isinstance(v, str) else v
            assert _outcome(ours, value, p, ctx) == _outcome(reference, value, p, ctx), (name, p.name, v)
            checked += 1
        if multi:
            value = ("a.json", "b.json", "")
            assert _outcome(ours, value, p, ctx) == _outcome(reference, value, p, ctx), (name, p.name)
    assert fast > 30 and checked > 1000  # the cheap path covers the commands' options


def test_analyze_options_import_no_pydantic(tmp_path):
    code = (
        "import sys\n"
        "from tracediag.cli import main\n"
        "try:\n"
        f"    main(['analyze', {str(tmp_path / 'missing.json')!r}, '-o', {str(tmp_path / 'out')!r}, '-q', '--tp', '2',"
        " '--hbm-bandwidth', '900', '--log', 'a.log', '--log', 'b.log', '--slo', 'ttft=500'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 2, exc.code\n"
        "print('pydantic' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
