"""`python -m titan_fp4six.train` turns torchtitan's bare errors (KeyError for a converter typo, AssertionError
for parallel degrees that do not fit WORLD_SIZE) into errors that say what to do, before the trainer starts; it
and the RL launcher start torchtitan with the caching allocator's expandable segments, unless the user set it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torchtitan.config.manager import ConfigManager

from tests.helpers.integration_helpers import CONFIG_MODULE, job_config
from titan_fp4six.integration.allocator import ALLOC_ENVS, expandable_segments_by_default
from titan_fp4six.integration.checks import check_job_config
from titan_fp4six.integration.nonfinite import NonFiniteWatch, check_finite, nonfinite_allowed
from titan_fp4six.integration.converters import check_converter_names
from titan_fp4six.train import check_world_size

REPO_CONFIG = "configs/deepseek_v3_debugmodel_nvfp4_four_over_six.toml"
REPO = Path(__file__).resolve().parents[1]


def test_converter_typo_names_the_registered_converters():
    with pytest.raises(ValueError, match=r"model.converters lists \['quantize.linear.four_over_sx'\], which no "
                                         r"converter is registered as; valid: .*quantize.linear.four_over_six"):
        check_converter_names(job_config(converters="quantize.linear.four_over_sx"))
    check_converter_names(job_config())


def test_the_plugins_converter_without_its_config_module_says_to_set_it():
    """Not "which no converter is registered as", naming the right converter as invalid."""
    job = ConfigManager().parse_args(["--model.converters", "quantize.grouped_mm.four_over_six"])
    with pytest.raises(ValueError, match=r"model.converters lists quantize.grouped_mm.four_over_six but its config "
                                         rf'section is missing: set \[job\] custom_config_module = "{CONFIG_MODULE}"'):
        check_converter_names(job)


def _recipe(tmp_path, text: str) -> str:
    toml = tmp_path / "recipe.toml"
    toml.write_text(f'[job]\ncustom_config_module = "{CONFIG_MODULE}"\n{text}')
    return str(toml)


@pytest.mark.parametrize("text, args", [
    ('[model]\nconverters = []\n[quantize.grouped_mm.four_over_six]\nfqns = ["experts"]\n', []),  # defaults only
    ("[model]\nconverters = []\n", ["--quantize.linear.four_over_six.scale_bound", "448"]),
    ('[model]\nconverters = ["quantize.linear.four_over_six"]\n[quantize.grouped_mm.four_over_six]\n'
     'weight_block = "1x16"\n', []),
])
def test_a_configured_section_without_its_converter_is_an_error(tmp_path, text, args):
    """It trained plain bf16 without a word."""
    job = ConfigManager().parse_args(["--job.config_file", _recipe(tmp_path, text), *args])
    with pytest.raises(ValueError, match=r"\[quantize\.(linear|grouped_mm)\.four_over_six\] is configured but "
                                         r"model.converters=.* does not list .*a plain bf16 run.*add it"):
        check_job_config(job)


@pytest.mark.parametrize("recipe", ["configs/deepseek_v3_debugmodel_bf16.toml", REPO_CONFIG,
                                    "configs/deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears.toml"])
def test_the_shipped_recipes_pass_the_start_up_checks(recipe):
    check_job_config(ConfigManager().parse_args(["--job.config_file", str(REPO / recipe)]))


def test_non_finite_steps_stop_unless_allowed(tmp_path):
    """What both launchers call after each step."""
    check_finite(3, 2.5, 0.7, allow=False)
    with pytest.raises(FloatingPointError, match=r"step 7: non-finite grad norm \(inf\); stopped before this "
                                                 r"step's checkpoint.*training.allow_nonfinite = true"):
        check_finite(7, 2.5, float("inf"), allow=False)
    with pytest.raises(FloatingPointError, match=r"step 2: non-finite loss \(nan\) and grad norm \(nan\)"):
        check_finite(2, float("nan"), float("nan"), allow=False)
    check_finite(2, float("nan"), float("nan"), allow=True)
    assert not nonfinite_allowed(job_config().training)
    assert nonfinite_allowed(job_config("--training.allow_nonfinite").training)
    job = ConfigManager().parse_args(["--job.config_file", _recipe(tmp_path, "[training]\nallow_nonfinite = 1\n")])
    with pytest.raises(ValueError, match=r"training.allow_nonfinite=1; it must be true or false"):
        nonfinite_allowed(job.training)


def test_the_watch_keeps_the_first_non_finite_step_until_checked():
    """The launcher records every step on the device and reads the record only on logging and checkpoint steps:
    the error names the first bad step, its values and the step that read it."""
    watch = NonFiniteWatch()
    watch.check(1)  # nothing recorded yet
    for step, loss, norm in [(1, 2.5, 0.7), (2, 2.4, 0.6)]:
        watch.record(step, torch.tensor(loss), torch.tensor(norm))
    watch.check(2)
    watch.record(3, torch.tensor(float("nan")), torch.tensor(0.5))
    watch.record(4, torch.tensor(2.0), torch.tensor(float("inf")))  # a later bad step does not replace the first
    watch.record(5, torch.tensor(2.0), torch.tensor(0.5))
    with pytest.raises(FloatingPointError, match=r"step 3: non-finite loss \(nan\); stopped at step 5 \(the first "
                                                 r"step that read it\), before its checkpoint"):
        watch.check(5)


@pytest.mark.parametrize("seed", ["99999999999999999999999", "-9223372036854775809"])
def test_a_seed_torch_cannot_take_is_named(seed):
    with pytest.raises(ValueError, match=rf"debug.seed={seed}: torch's generators take a seed in \[-2\*\*63, 2\*\*63\)"):
        check_job_config(job_config("--debug.seed", seed))
    check_job_config(job_config("--debug.seed", str(2 ** 63 - 1)))


def test_an_unknown_flavor_names_the_valid_ones():
    """torchtitan's train.py failed with a bare KeyError: 'debugmodel_nope'."""
    with pytest.raises(ValueError, match=r"model.flavor='debugmodel_nope' is not a flavor of model.name="
                                         r"'deepseek_v3'; valid: .*debugmodel, .*tiny"):
        check_job_config(job_config("--model.name", "deepseek_v3", "--model.flavor", "debugmodel_nope"))


def test_a_flavor_registered_by_custom_import_is_a_valid_flavor(tmp_path, monkeypatch):
    """The flavor check ran before torchtitan imports experimental.custom_import, refusing the flavor it adds."""
    from torchtitan.models.deepseek_v3 import deepseekv3_args

    from titan_fp4six.train import check_before_training

    monkeypatch.setenv("WORLD_SIZE", "1")

    (tmp_path / "user_flavor_66.py").write_text(
        "from torchtitan.models.deepseek_v3 import deepseekv3_args\n"
        "deepseekv3_args['user_flavor_66'] = deepseekv3_args['tiny']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "user_flavor_66", raising=False)
    try:
        check_before_training(job_config("--model.name", "deepseek_v3", "--model.flavor", "user_flavor_66",
                                    "--experimental.custom_import", "user_flavor_66"))
    finally:
        deepseekv3_args.pop("user_flavor_66", None)
        sys.modules.pop("user_flavor_66", None)
    with pytest.raises(ValueError, match=r"experimental.custom_import='nope_66' is not importable "
                                         r"\(ModuleNotFoundError: No module named 'nope_66'\)"):
        check_before_training(job_config("--experimental.custom_import", "nope_66"))


def test_a_second_run_into_a_busy_dump_folder_is_refused(tmp_path):
    """Two trainings started into one --job.dump_folder both exited 0, the folder holding only the last writer's
    checkpoints."""
    from tests.helpers.training_harness import launch

    hold = ("import sys, time; from titan_fp4six.integration.dump_lock import lock_dump_folder; "
            "lock_dump_folder(sys.argv[1]); print('held', flush=True); time.sleep(300)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / "run")], cwd=REPO, stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, RANK="0"))
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = launch("qwen3_moe_debug_nvfp4_four_over_six.toml", tmp_path / "run", "--training.steps", "1")
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode != 0 and not (tmp_path / "run" / "losses.json").exists()
    assert f"is in use by another run (pid, host: {holder.pid} " in proc.stderr, proc.stderr[-3000:]
    free = subprocess.run([sys.executable, "-c", hold.replace("time.sleep(300)", "0"), str(tmp_path / "run")],
                          cwd=REPO, capture_output=True, text=True, env=dict(os.environ, RANK="0"))
    assert free.stdout.strip() == "held", free.stderr  # a killed holder leaves the folder free


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
    (["--model.flavor", "debugmodel_nope"], "is not a flavor of model.name='deepseek_v3'"),
])
def test_launcher_reports_them_before_training(args, match):
    cmd = [sys.executable, "-m", "titan_fp4six.train", "--job.config_file", REPO_CONFIG,
           "--job.custom_config_module", CONFIG_MODULE, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    assert "ValueError: " in done.stderr and match in done.stderr, done.stderr[-3000:]


def test_expandable_segments_by_default_leaves_a_users_setting():
    env = {}
    expandable_segments_by_default(env)
    assert env == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    for name in ALLOC_ENVS:
        env = {name: "max_split_size_mb:128"}
        expandable_segments_by_default(env)
        assert env == {name: "max_split_size_mb:128"}


def test_converters_hint_when_a_cuda_run_has_no_allocator_setting(monkeypatch, caplog):
    from titan_fp4six.integration import allocator

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    allocator._warn_once.cache_clear()
    allocator.hint_without_expandable_segments({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})
    assert "PYTORCH_ALLOC_CONF is not set" not in caplog.text  # the user chose
    allocator.hint_without_expandable_segments({})
    allocator.hint_without_expandable_segments({})
    assert caplog.text.count("PYTORCH_ALLOC_CONF is not set") == 1  # once per process, not per converter


_PRINT_ALLOC_ENV = ("import os, sys, runpy, torchtitan.train as tt; "
                    "tt.main = lambda trainer: print('ALLOC', os.environ.get('PYTORCH_ALLOC_CONF'), "
                    "os.environ.get('PYTORCH_CUDA_ALLOC_CONF')); runpy.run_module(sys.argv[1], run_name='__main__')")


@pytest.mark.parametrize("module", ["titan_fp4six.train", "titan_fp4six.rl"])
@pytest.mark.parametrize("user, expected", [({}, "ALLOC expandable_segments:True None"),
                                            ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"},
                                             "ALLOC None expandable_segments:False")])
def test_launchers_start_torchtitan_with_expandable_segments(module, user, expected):
    """Both launchers set the allocator before torchtitan's main runs (torchtitan's main stubbed to print it)."""
    env = {k: v for k, v in os.environ.items() if k not in ALLOC_ENVS} | user
    done = subprocess.run([sys.executable, "-c", _PRINT_ALLOC_ENV, module], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO)
    assert expected in done.stdout.splitlines(), done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.parametrize("module", ["titan_fp4six.train", "titan_fp4six.rl"])
@pytest.mark.parametrize("env, value", [("TITAN_FP4SIX_QUANTIZER", "bogus"), ("TITAN_FP4SIX_EMULATE", "yes")])
def test_launchers_refuse_bad_environment_overrides_before_torchtitan_starts(module, env, value):
    """Not at the first rollout or forward: torchtitan's main (stubbed to print) is never reached."""
    done = subprocess.run([sys.executable, "-c", _PRINT_ALLOC_ENV, module], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, **{env: value}), cwd=REPO)
    assert done.returncode != 0 and "ALLOC" not in done.stdout
    assert f"ValueError: {env}='{value}' is not supported; valid values" in done.stderr, done.stderr[-2000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_setting_gives_expandable_segments_on_cuda():
    code = ("from titan_fp4six.integration.allocator import expandable_segments_by_default as f; f(); import torch; "
            "x = torch.empty(1 << 20, device='cuda'); "
            "print('EXPANDABLE', all(s['is_expandable'] for s in torch.cuda.memory._snapshot()['segments']))")
    env = {k: v for k, v in os.environ.items() if k not in ALLOC_ENVS}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                          cwd=REPO)
    assert "EXPANDABLE True" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


def test_a_finished_run_exits_with_its_status_and_its_output_flushed():
    """exit_after_run ends the process without Python's finalization (where gloo's threads can abort it) after
    flushing what the run printed and logged, and exits with the run's status."""
    code = ("import logging, sys\nfrom titan_fp4six.train import exit_after_run\n"
            "logging.basicConfig(stream=sys.stderr)\nlogging.getLogger('t').warning('logged')\n"
            "print('printed', end='')\nexit_after_run(3)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a pipe's stdout then buffers
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (3, "printed") and "logged" in proc.stderr


def test_a_run_that_leaves_python_threads_working_exits_through_python(tmp_path):
    """exit_after_run leaves a Python thread still at work (an asynchronous checkpoint's writer) to Python's exit,
    which waits for it: the thread's file is written."""
    code = ("import pathlib, sys, threading, time\nfrom titan_fp4six.train import exit_after_run\n"
            "def write():\n    time.sleep(0.5)\n    pathlib.Path(sys.argv[1]).write_text('saved')\n"
            "threading.Thread(target=write).start()\nexit_after_run(0)")
    out = tmp_path / "saved.txt"
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and out.read_text() == "saved", proc.stderr
