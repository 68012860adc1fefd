"""The memory bounds' measurement: a command's own peak, not the test process's image (tests/peak_rss.py)."""

from __future__ import annotations

import sys

from peak_rss import run_measured


def test_a_small_command_reads_small_however_large_the_test_process_is(tmp_path):
    ballast = bytearray(400 * 2**20)  # the test process grown past any bound, as after a long session
    ballast[::4096] = b"x" * len(ballast[::4096])  # touched: resident
    small = [sys.executable, "-c", "pass"]
    # (os.wait4 of `small` run directly read 411 MB here: the kernel counts the fork's image of this process)
    with open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
        code, _, own_mb = run_measured(small, 60, out, err)
    assert code == 0
    assert own_mb < 60, own_mb  # the interpreter alone
    del ballast


def test_the_command_s_exit_status_and_its_own_growth_are_reported(tmp_path):
    grow = [sys.executable, "-c", "import sys; b = bytearray(150 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
            "sys.exit(3)"]
    with open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
        code, _, own_mb = run_measured(grow, 60, out, err)
    assert code == 3
    assert 150 <= own_mb < 250, own_mb
