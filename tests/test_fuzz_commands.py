"""Fuzzing of command lines, of tracediag's own outputs read back, and of file-system faults at the output paths
(tests/fuzz/commands.py has the cases and the contract: exit 0/1/2/4 only, exit 2 one line, no file of the
user's changed, nothing partial left). A fixed, derandomized budget in the normal suite; more with
`TRACEDIAG_FUZZ_EXAMPLES=N`, and the long run is `python benchmarks/fuzz_long.py --target commands`.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path

import pytest
from fuzz import commands
from hypothesis import Phase, given
from hypothesis import strategies as st
from test_fuzz import budget

EXAMPLES = {"command-line": 14, "read-back": 10, "fs-fault": 8, "store-tamper": 8}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz-built")


@pytest.mark.parametrize("kind", commands.KINDS)
def test_command_lines_outputs_and_file_system_faults_keep_the_contract(kind, built):
    # no shrinking: each example is a whole CLI run, and the failure message already holds the command line
    @budget(EXAMPLES[kind], phases=(Phase.explicit, Phase.reuse, Phase.generate))
    @given(rnd=st.randoms(use_true_random=False))
    def check(rnd: random.Random) -> None:
        work = Path(tempfile.mkdtemp(prefix=f"fuzz-{kind}-"))
        case = commands.make_case(kind, rnd, work, built)
        outcome = commands.check_case(case)
        assert not outcome.defect, f"{outcome.status}: {outcome.detail} (workspace kept at {work})"
        shutil.rmtree(work, ignore_errors=True)

    check()
