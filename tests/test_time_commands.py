"""scripts/time_commands.py reads what the README's commands print: pytest's summaries, the step lines' losses."""

import pytest

from scripts.time_commands import duration, losses, main, pytest_stages, row


def test_pytest_stages_in_order_with_their_times():
    log = ("....\n1185 passed, 162 skipped in 521.30s (0:08:41)\nsetup log\n"
           "==== 43 passed in 40.02s ====\n\x1b[32m19 passed, 2 warnings in 71.5s\x1b[0m\n")
    assert pytest_stages(log) == "1185 passed, 162 skipped (8 min 41 s); 43 passed (40 s); 19 passed (1 min 12 s)"
    assert pytest_stages(log, ("suite", "0.3")) == ("suite: 1185 passed, 162 skipped (8 min 41 s); 0.3: 43 passed "
                                                    "(40 s); 19 passed (1 min 12 s)")
    assert pytest_stages("1 failed, 3 passed in 2.00s") == "1 failed, 3 passed (2 s)"


def test_losses_from_training_and_grpo_step_lines():
    train = "step:  1  loss:  8.2345  grad_norm: 1\nstep: 12  loss:  6.9012  grad_norm: 1\n"
    grpo = "\x1b[31mstep:  2  \x1b[32mreward: 0.0000  \x1b[38;2;180;60;0mloss: -0.35771  grad_norm: 0.008"
    assert losses(train) == "12 steps, loss 8.23 -> 6.90"
    assert losses(grpo) == "2 steps, loss -0.36 -> -0.36"
    assert losses("Traceback") == "no step lines"


def test_a_failed_command_shows_in_its_row():
    assert row("bash x.sh", 61, "ran", 0) == "| `bash x.sh` | 1 min 1 s | ran |"
    assert "**exit 2**" in row("bash x.sh", 5, "ran", 2) and duration(5) == "5 s"


def test_only_names_the_valid_parts(capsys):
    with pytest.raises(SystemExit):
        main(["--only", "readme,gpus"])
    assert "--only: unknown ['gpus']; valid: ['gpu', 'readme', 'tools']" in capsys.readouterr().err
