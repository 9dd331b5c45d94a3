"""`python -m titan_fp4six.train` turns torchtitan's bare errors (KeyError for a converter typo, AssertionError
for parallel degrees that do not fit WORLD_SIZE) into errors that say what to do, before the trainer starts."""

import subprocess
import sys

import pytest

from tests.helpers.integration_helpers import CONFIG_MODULE, job_config
from titan_fp4six.integration.converters import check_converter_names
from titan_fp4six.train import check_world_size

REPO_CONFIG = "configs/deepseek_v3_debugmodel_nvfp4_four_over_six.toml"


def test_converter_typo_names_the_registered_converters():
    with pytest.raises(ValueError, match=r"model.converters lists \['quantize.linear.four_over_sx'\], which no "
                                         r"converter is registered as; valid: .*quantize.linear.four_over_six"):
        check_converter_names(job_config(converters="quantize.linear.four_over_sx"))
    check_converter_names(job_config())


@pytest.mark.parametrize("args, world, match", [
    (["--parallelism.tensor_parallel_degree", "2"], 1, r"tensor_parallel_degree=2 .*needs 2 processes .*WORLD_SIZE=1"),
    (["--parallelism.data_parallel_shard_degree", "2"], 1, r"needs 2 processes"),
    (["--parallelism.data_parallel_shard_degree", "1"], 2, r"needs 1 processes .*WORLD_SIZE=2"),
    (["--parallelism.tensor_parallel_degree", "2"], 3, r"--nproc_per_node=2"),
])
def test_parallel_degrees_that_do_not_fit_the_world_size(args, world, match):
    with pytest.raises(ValueError, match=match):
        check_world_size(job_config(*args).parallelism, world)


@pytest.mark.parametrize("world, args", [(1, []), (4, []), (4, ["--parallelism.tensor_parallel_degree", "2"]),
                                         (2, ["--parallelism.data_parallel_shard_degree", "2"])])
def test_parallel_degrees_that_fit(world, args):
    check_world_size(job_config(*args).parallelism, world)


@pytest.mark.parametrize("args, match", [
    (["--model.converters", "quantize.linear.four_over_sx"], "which no converter is registered as"),
    (["--parallelism.tensor_parallel_degree", "2"], "needs 2 processes"),
])
def test_launcher_reports_them_before_training(args, match):
    cmd = [sys.executable, "-m", "titan_fp4six.train", "--job.config_file", REPO_CONFIG,
           "--job.custom_config_module", CONFIG_MODULE, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    assert "ValueError: " in done.stderr and match in done.stderr, done.stderr[-3000:]
