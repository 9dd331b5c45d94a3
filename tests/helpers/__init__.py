"""Shared helpers of the tests: oracles, case generators and training harnesses (imported as tests.helpers.*)."""
