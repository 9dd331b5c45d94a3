"""A user's task: prompts from a JSON-lines dataset and a reward function by import path ([rl] dataset, reward,
max_new_tokens), trained by `python -m titan_fp4six.rl`; what is missing is named when the config loads."""

import json
import os
import random
import re
import subprocess
import sys

import pytest

from tests.helpers.training_harness import CPU_ARGS, REPO
from titan_fp4six.rl.task import DatasetTask

RECIPE = str(REPO / "configs" / "rl_grpo_qwen3_moe_debug_nvfp4_four_over_six.toml")
EMBEDDED = REPO / "titan_fp4six" / "integration" / "embedded"
REWARD = "tests.helpers.rewards:prefix_match"


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                            for a, b in [(1, 2), (3, 4), (2, 2), (5, 1)]))
    return path


def test_dataset_prompts_and_rewards(dataset):
    task = DatasetTask(dataset, REWARD, EMBEDDED, 3)
    examples = task.examples(8, random.Random(0))
    assert len(examples) == 8 and all(e.tokens[0] == task.prompts[e.answer][0] for e in examples)
    e = next(x for x in examples if task.rows[x.answer][1] == "3")
    three = task.tokenizer.encode("3", add_special_tokens=False).ids
    assert task.reward(e, [*three, task.eos]) == 1.0
    assert task.reward(e, task.tokenizer.encode("4", add_special_tokens=False).ids) == 0.0
    assert task.max_positions() == max(map(len, task.prompts)) + 3


def test_grpo_trains_on_a_dataset_task(dataset, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO)]), CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "titan_fp4six.rl", "--job.config_file", RECIPE, *CPU_ARGS, "--training.steps", "2",
           "--job.dump_folder", str(tmp_path / "run"), "--rl.dataset", str(dataset), "--rl.reward", REWARD,
           "--rl.max_new_tokens", "3", "--rl.prompts_per_step", "2", "--rl.group_size", "2",
           "--rl.rollouts_file", "rollouts/rank{rank}.jsonl"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "rank0.jsonl").read_text().splitlines()]
    assert len(rollouts) == 8 and all(1 <= len(r["response"]) <= 3 and 0 <= r["reward"] <= 1 for r in rollouts)


@pytest.mark.parametrize("args, match", [
    (["--rl.reward", REWARD], r"a dataset task needs both"),
    (["--rl.dataset", "DATA", "--rl.reward", "tests.helpers.nope:prefix_match"],
     r"module 'tests.helpers.nope' is not importable"),
    (["--rl.dataset", "DATA", "--rl.reward", "tests.helpers.rewards:nope"],
     r"module 'tests.helpers.rewards' has no function 'nope'"),
    (["--rl.dataset", "DATA", "--rl.reward", "tests.helpers.rewards"], r"write it as 'package.module:function'"),
    (["--rl.dataset", "DATA", "--rl.reward", REWARD, "--rl.max_new_tokens", "0"],
     r"rl.max_new_tokens=0: a dataset task needs"),
    (["--rl.dataset", "missing.jsonl", "--rl.reward", REWARD], r"rl.dataset='missing.jsonl': no such file"),
])
def test_dataset_task_knobs_are_checked_when_the_config_loads(dataset, args, match, capsys):
    from torchtitan.config.manager import ConfigManager

    with pytest.raises(SystemExit):
        ConfigManager().parse_args(["--job.config_file", RECIPE, "--rl.max_new_tokens", "3",
                                    *[str(dataset) if a == "DATA" else a for a in args]])
    assert re.search(match, re.sub(r"[│╭╮╰╯─\s]+", " ", capsys.readouterr().err))


@pytest.mark.parametrize("line, match", [('{"prompt": "x"}', r"line 2: needs a string field 'answer'"),
                                         ("not json", r"line 2: not JSON")])
def test_a_bad_dataset_line_is_named(tmp_path, line, match, capsys):
    from torchtitan.config.manager import ConfigManager

    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "answer": "b"}\n' + line + "\n")
    with pytest.raises(SystemExit):
        ConfigManager().parse_args(["--job.config_file", RECIPE, "--rl.dataset", str(path), "--rl.reward", REWARD,
                                    "--rl.max_new_tokens", "3"])
    assert re.search(match, re.sub(r"[│╭╮╰╯─\s]+", " ", capsys.readouterr().err))


def test_a_dataset_longer_than_the_rope_table_is_refused_before_the_build(tmp_path, monkeypatch):
    from torchtitan.config.manager import ConfigManager

    from titan_fp4six.rl.trainer import check_rl_job

    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"prompt": "1 2 3 4 5 6 7 8 9 " * 8, "answer": "x"}) + "\n")
    monkeypatch.setenv("WORLD_SIZE", "1")
    job = ConfigManager().parse_args(["--job.config_file", RECIPE, "--model.flavor", "tiny", "--rl.dataset", str(path),
                                      "--rl.reward", REWARD, "--rl.max_new_tokens", "8"])
    with pytest.raises(ValueError, match=r"its longest prompt \(\d+ tokens\) and rl.max_new_tokens=8 take \d+ "
                                         r"positions, more than training.seq_len=64 .*raise training.seq_len to \d+"):
        check_rl_job(job, engine=False)


def test_a_prompt_of_no_tokens_is_refused_when_the_task_is_built(tmp_path):
    """Qwen3's tokenizer adds no <bos>: an empty prompt would reach the generator as no tokens, on one rank, mid-run."""
    import shutil

    folder = tmp_path / "tok"
    shutil.copytree(EMBEDDED, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "bos_token": None}))
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n" + json.dumps({"prompt": "", "answer": "x"}))
    with pytest.raises(ValueError, match=r"example 2's prompt is no tokens"):
        DatasetTask(path, REWARD, folder, 3)
