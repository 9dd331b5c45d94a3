"""scripts/tt03_losses.py's table: every run's losses against 0.2.2's, the largest relative difference shown."""

from scripts.tt03_losses import table


def test_table_lists_each_run_with_its_largest_relative_difference_to_0_2():
    ref = [8.0, 4.0]
    text = table([("0.2.2", ref, 1.5, 60.0), ("0.3.0", [8.0, 4.4], 1.25, 31.2)], ref)
    lines = text.splitlines()
    assert lines[0] == "| run | loss 1 | loss 2 | step-1 grad norm | max rel. diff. to 0.2.2 | wall s |"
    assert lines[2] == "| 0.2.2 | 8.00000 | 4.00000 | 1.5000 | 0.0e+00 | 60 |"
    assert lines[3] == "| 0.3.0 | 8.00000 | 4.40000 | 1.2500 | 1.0e-01 | 31 |"
