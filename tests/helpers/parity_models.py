"""`--experimental.custom_import tests.helpers.parity_models` (repository root on PYTHONPATH): the "tiny" flavors of training_harness plus
the global-batch dataloader of scripts.parity, for the 1-vs-2-process tests."""

import tests.helpers.training_harness  # noqa: F401  (registers the tiny flavors on import)

import scripts.parity  # noqa: F401  (same global batch at any DP degree)
