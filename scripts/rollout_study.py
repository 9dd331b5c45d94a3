"""The rollout-distance study over training runs (docs/fidelity.md, "Rollouts against the bf16 policy"), one command:
trains bf16 checkpoints of the `small` Qwen3 MoE flavor for SEEDS seeds in each regime, then scores every
checkpoint with scripts/rollout_distance.py and writes its page (intervals over training runs, per regime).

    python3 -m scripts.rollout_study OUT_DIR [--seeds 5] [--seed-start 0] [--regime NAME:STEPS:BATCH:SEQ_LEN:WARMUP ...]
        [--phase train|score|report ...] [--vllm auto|first|all|none] [--dry-run] [--docs [PATH]]
        [--window 128 --prompt 32 --response 64 --max-windows 0]   (passed to scripts/rollout_distance.py)

Regimes (default): "memorizing", the checkpoint docs/fidelity.md measured: 1500 steps of 32 x 512 tokens (about 65
passes over the 377k-token training split), warm-up 50; "short": 150 steps of 8 x 512 tokens, warm-up 15 (614k
tokens, 1.6 passes: every document seen at most twice, so held-out loss stays near training loss, while the model
gets 150 optimizer steps, where one pass at 32 x 512 would be 23). Every run: configs/
qwen3_moe_debug_bf16.toml (lr 8e-4), --debug.seed SEED (0..SEEDS-1; seed 0 is the recipe's own, the setup of the
single checkpoint measured before), --debug.deterministic, every step logged, and torchtitan's checkpointer on:
one model-only checkpoint at the last step, exported in bf16 (the scoring rounds every weight to bf16 anyway, so
it reads the same numbers from half the bytes). On the GPU when there is one (several runs at once, memory
permitting, through titan_fp4six.compare's scheduler), else on the CPU in FP32, one at a time.

Resumable: a run whose log, command and exit status are there is not trained again, a checkpoint whose scores are
in OUT_DIR/scores with the same settings is not scored again; a call can be cut (a machine's time limit) and the
same command resumes. A study can also be spread over machine calls, a part each (--regime NAME, --seeds and
--seed-start): their folders, copied into one without the checkpoints' *.distcp files, make one page with
`python3 -m scripts.rollout_distance --out OUT_DIR --report-only --phases 'OUT_DIR/phases.*.json'`. Each
finished run gets OUT_DIR/REGIME/seedN/run.json: its command, wall seconds and final training loss (the mean of
the last steps // 10 steps' losses, logged before each update); the scoring adds the
bf16 model's held-out loss on the split it scores (cut into training-length sequences as the trainer cuts data).
Scoring runs on the CPU (FP32 reference quantizers, as the existing table), --score-jobs checkpoints at once, one
process each; vLLM (the plugin-agreement check and the vLLM |logp difference|) runs for the first seed of each
regime when this Python has vllm (`auto`), as `.venv-vllm/bin/python -m scripts.rollout_study ...`. The page is
OUT_DIR/rollout_distance.md (+ .json); --docs also writes it to PATH (default docs/results/rollout_distance.md).
"""

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from titan_fp4six.compare.runs import Job, Scheduler, command, device_memory_gib, parse_steps
from titan_fp4six.compare.stats import final_loss

REPO = Path(__file__).resolve().parents[1]
CONFIG = Path("configs/qwen3_moe_debug_bf16.toml")
REGIMES = ("memorizing:1500:32:512:50", "short:150:8:512:15")
PHASES = ("train", "score", "report")


@dataclass(frozen=True)
class Regime:
    name: str
    steps: int
    batch: int
    seq_len: int
    warmup: int

    @property
    def tail(self) -> int:
        """Steps whose mean loss is the final training loss."""
        return max(1, self.steps // 10)


def parse_regime(text: str) -> Regime:
    """NAME:STEPS:BATCH:SEQ_LEN:WARMUP, or a default regime's bare name."""
    parts = text.split(":")
    defaults = {d.split(":")[0]: d for d in REGIMES}
    if len(parts) == 1 and text in defaults:
        parts = defaults[text].split(":")
    if len(parts) != 5 or not parts[0].replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"--regime {text!r}: give NAME:STEPS:BATCH:SEQ_LEN:WARMUP, e.g. short:150:8:512:15")
    try:
        steps, batch, seq_len, warmup = map(int, parts[1:])
    except ValueError:
        raise ValueError(f"--regime {text!r}: STEPS, BATCH, SEQ_LEN and WARMUP must be integers") from None
    if min(steps, batch, seq_len) < 1 or not 0 <= warmup <= steps:
        raise ValueError(f"--regime {text!r}: steps, batch and seq_len must be positive, 0 <= warmup <= steps")
    return Regime(parts[0], steps, batch, seq_len, warmup)


@dataclass
class Run:
    regime: Regime
    seed: int
    job: Job

    @property
    def dump(self) -> Path:
        return self.job.log.parent

    @property
    def checkpoint(self) -> Path:
        return self.dump / "checkpoint" / f"step-{self.regime.steps}"

    @property
    def record(self) -> Path:
        return self.dump / "run.json"


def plan(out: Path, regimes: list[Regime], seeds: int, cuda: bool, seed_start: int = 0) -> list[Run]:
    runs = []
    for r in regimes:
        common = ["--model.flavor", "small", "--training.local_batch_size", str(r.batch), "--training.seq_len",
                  str(r.seq_len), "--lr_scheduler.warmup_steps", str(r.warmup), "--checkpoint.enable",
                  "--checkpoint.folder", "checkpoint", "--checkpoint.interval", str(r.steps),
                  "--checkpoint.last_save_model_only", "--checkpoint.export_dtype", "bfloat16"]
        cpu = [] if cuda else ["--training.mixed_precision_param", "float32"]
        for seed in range(seed_start, seed_start + seeds):
            dump = out / r.name / f"seed{seed}"
            cmd = command(CONFIG, seed, r.steps, dump, common, cpu)
            runs.append(Run(r, seed, Job(r.name, seed, cmd, dump / "train.log")))
    return runs


class TimedScheduler(Scheduler):
    """compare's scheduler, keeping each finished run's wall seconds."""

    def _finish(self, job: Job, code: int, done: int, total: int) -> None:
        job.seconds = time.monotonic() - job.started
        super()._finish(job, code, done, total)


def where(cuda: bool) -> str:
    """The device a phase ran on, named for the page: a study's parts may run on different machines."""
    if cuda:
        import torch

        return f"the GPU ({torch.cuda.get_device_name()})"
    return f"the CPU ({os.cpu_count()} cores)"


def write_record(run: Run) -> dict | None:
    """run.json of a finished run, else None. A run not trained by this call keeps the record of the call that
    trained it: scoring on another machine (the CPU after a GPU) would build another command (its precision
    flag) and has no training time."""
    if run.job.exit_code() != 0 or not (run.checkpoint / ".metadata").is_file():
        return None
    seconds = getattr(run.job, "seconds", None)
    if run.record.is_file() and seconds is None:
        return json.loads(run.record.read_text())
    losses = {int(row["step"]): row["loss"] for row in parse_steps(run.job.log.read_text(errors="replace"))}
    r = run.regime
    record = {"regime": r.name, "seed": run.seed, "steps": r.steps, "batch": r.batch, "seq_len": r.seq_len,
              "warmup": r.warmup, "tail": r.tail, "train_loss": final_loss(losses, r.steps, r.tail),
              "seconds": seconds, "checkpoint": str(run.checkpoint), "command": shlex.join(run.job.command[1:])}
    run.record.write_text(json.dumps(record, indent=1))
    return record


def score_args(a) -> list[str]:
    return ["--window", str(a.window), "--prompt", str(a.prompt), "--response", str(a.response), "--seed",
            str(a.sample_seed), "--max-windows", str(a.max_windows)]


def score_commands(a, runs: list[Run], vllm: set[str]) -> list[tuple[Run, list[str]]]:
    """One scoring process per checkpoint: `--score-only` into OUT/scores, vLLM for the chosen ones."""
    return [(run, [sys.executable, "-m", "scripts.rollout_distance", "--checkpoint", str(run.checkpoint), "--out",
                   str(a.out), "--score-only", "--vllm", "all" if label(run) in vllm else "none", *score_args(a)])
            for run in runs]


def needs_scoring(a, run: Run, with_vllm: bool) -> bool:
    """No score file of this checkpoint with these settings (and vLLM's numbers when asked) in OUT/scores."""
    from scripts.rollout_distance import Checkpoint, cached, settings

    knobs = argparse.Namespace(window=a.window, prompt=a.prompt, response=a.response, seed=a.sample_seed,
                               max_windows=a.max_windows)
    want = settings(knobs, Checkpoint(run.checkpoint, run.regime.name, label(run), None), run.regime.seq_len,
                    a.out)
    return cached(a.out / "scores" / f"{label(run)}.json", want, with_vllm) is None


def report_command(a, runs: list[Run], vllm_mode: str) -> list[str]:
    cmd = [sys.executable, "-m", "scripts.rollout_distance"]
    for run in runs:
        cmd += ["--checkpoint", str(run.checkpoint)]
    cmd += ["--out", str(a.out), "--vllm", vllm_mode, "--phases", str(a.out / "phases.*.json"), *score_args(a)]
    return cmd + (["--docs", a.docs] if a.docs else [])


def label(run: Run) -> str:
    return f"{run.regime.name}-seed{run.seed}"  # the label scripts/rollout_distance.py gives a run with run.json


def vllm_choice(mode: str, runs: list[Run]) -> tuple[str, set[str]]:
    """(the report's --vllm, the labels scored through vLLM): `auto` is `first` when this Python has vllm."""
    if mode == "auto":
        mode = "first" if importlib.util.find_spec("vllm") else "none"
    if mode == "none":
        return mode, set()
    if mode == "all":
        return mode, {label(r) for r in runs}
    firsts: dict[str, str] = {}
    for r in runs:
        firsts.setdefault(r.regime.name, label(r))
    return mode, set(firsts.values())


def run_parallel(commands: list[tuple[str, list[str], Path]], jobs: int) -> dict[str, tuple[int, float]]:
    """Run (name, command, log) at most `jobs` at once, each with an equal share of the CPU cores as its threads;
    {name: (exit status, seconds)}."""
    threads = max(1, (os.cpu_count() or 1) // max(1, min(jobs, len(commands))))
    # the CPU's FP32 reference path, as the single-checkpoint table; no process takes a CUDA context
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
    todo, running, result = list(commands), {}, {}
    try:
        while todo or running:
            while todo and len(running) < jobs:
                name, cmd, log = todo.pop(0)
                log.parent.mkdir(parents=True, exist_ok=True)
                with open(log, "w") as f:
                    f.write("# " + shlex.join(["python", *cmd[1:]]) + "\n")
                    f.flush()
                    running[name] = (subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO),
                                     time.monotonic())
            time.sleep(0.5)
            for name, (proc, started) in list(running.items()):
                if proc.poll() is not None:
                    result[name] = (proc.returncode, time.monotonic() - started)
                    del running[name]
                    print(f"[rollout_study] {name}: exit {proc.returncode}, {result[name][1]:.0f} s", flush=True)
    finally:  # stopped: no scoring outlives the study
        for proc, _ in running.values():
            proc.kill()
    return result


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m scripts.rollout_study", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("out", type=Path, metavar="OUT_DIR")
    p.add_argument("--seeds", type=int, default=int(os.environ.get("SEEDS", 5)),
                   help="training seeds per regime, 0..SEEDS-1 (default: $SEEDS or 5)")
    p.add_argument("--seed-start", type=int, default=0,
                   help="first seed (seeds are consecutive): a study spread over machine calls, part of the seeds "
                        "each, merged by `rollout_distance --report-only`")
    p.add_argument("--regime", action="append", metavar="NAME:STEPS:BATCH:SEQ_LEN:WARMUP",
                   help=f"a regime, or a default one's name (repeatable; default {' and '.join(REGIMES)})")
    p.add_argument("--phase", action="append", choices=PHASES, help="run only these phases (default: all, in order)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="most training runs at once on a GPU (memory permitting; default: the CPU count); CPU: 1")
    p.add_argument("--score-jobs", type=int, default=0,
                   help="checkpoints scored at once (default: all, up to the CPU count)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds before a training run is stopped")
    p.add_argument("--vllm", choices=("auto", "first", "all", "none"), default="auto",
                   help="checkpoints scored through vLLM too (auto: the first seed of each regime when vllm is "
                        "installed in this Python, else none)")
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--response", type=int, default=64)
    p.add_argument("--sample-seed", type=int, default=0, help="the response sampler's seed (rollout_distance --seed)")
    p.add_argument("--max-windows", type=int, default=0, help="score the first N held-out windows only (0: all)")
    p.add_argument("--docs", nargs="?", const="docs/results/rollout_distance.md", metavar="PATH",
                   help="also write the page to PATH in the repository (default docs/results/rollout_distance.md)")
    p.add_argument("--dry-run", action="store_true", help="print the commands of every phase, run nothing")
    a = p.parse_args(argv)
    if a.seed_start < 0:
        p.error(f"--seed-start {a.seed_start}: seeds are >= 0")
    if a.seeds < 1:
        p.error(f"--seeds {a.seeds}: at least 1 (2 or more for intervals over runs)")
    try:
        a.regimes = [parse_regime(t) for t in (a.regime or REGIMES)]
    except ValueError as e:
        p.error(str(e))
    names = [r.name for r in a.regimes]
    if len(set(names)) != len(names):
        p.error(f"--regime: two regimes share a name ({names})")
    a.phases = [ph for ph in PHASES if ph in (a.phase or PHASES)]
    a.tag = f"{'+'.join(names)}.seeds{a.seed_start}-{a.seed_start + a.seeds - 1}"  # this call's part of a study
    a.out = a.out.resolve()
    return a


def main(argv=None) -> int:
    a = parse(argv)
    import torch

    cuda = torch.cuda.is_available()
    runs = plan(a.out, a.regimes, a.seeds, cuda, a.seed_start)
    vllm_mode, vllm = vllm_choice(a.vllm, runs)
    this = shlex.join(["python3", "-m", "scripts.rollout_study", *(sys.argv[1:] if argv is None else argv)])
    if a.dry_run:
        print("# from the repository root")
        print("# train (" + ("GPU" if cuda else "CPU") + f"; resumable: finished runs are skipped)")
        for run in runs:
            print(shlex.join(["python3", *run.job.command[1:]]))
        print(f"# score (one process per checkpoint; vLLM for {sorted(vllm) or 'none'})")
        for _, cmd in score_commands(a, runs, vllm):
            print(shlex.join(["python3", *cmd[1:]]))
        print("# report")
        print(shlex.join(["python3", *report_command(a, runs, vllm_mode)[1:]]))
        return 0
    os.chdir(REPO)  # the commands name the recipe relative to the repository
    a.out.mkdir(parents=True, exist_ok=True)
    # every call that did work in a phase: its command and wall time (one file per set of regimes and seeds, so
    # that the folders of calls on different machines, each a part of the study, can be merged)
    calls_file = a.out / f"phase_calls.{a.tag}.json"
    calls = json.loads(calls_file.read_text()) if calls_file.is_file() else []
    status = 0
    if "train" in a.phases:
        started = time.monotonic()
        todo = [r for r in runs if not r.job.done_before()]
        for run in todo:  # a run killed while saving may have left a partial step folder
            shutil.rmtree(run.dump / "checkpoint", ignore_errors=True)
        TimedScheduler(a.jobs, device_memory_gib(), a.timeout, echo=lambda m: print(m, flush=True)).run(
            [r.job for r in runs])
        if todo:
            calls.append({"phase": f"train phase: {len(todo)} runs on {where(cuda)}, wall",
                          "command": this, "seconds": time.monotonic() - started})
    done = [r for r in runs if write_record(r) is not None]
    missing = [label(r) for r in runs if r not in done]
    if missing:
        print(f"[rollout_study] not trained (or failed): {', '.join(missing)}; going on with the others", flush=True)
        status = 1
    vllm_mode, vllm = vllm_choice(a.vllm, done)  # the first seed of a regime that trained
    failed = []
    if "score" in a.phases:
        todo = [(r, cmd) for r, cmd in score_commands(a, done, vllm) if needs_scoring(a, r, label(r) in vllm)]
        started = time.monotonic()
        jobs = a.score_jobs or min(len(todo), os.cpu_count() or 1)
        results = run_parallel([(label(r), cmd, a.out / "scores" / f"{label(r)}.log") for r, cmd in todo], jobs)
        failed = [name for name, (code, _) in results.items() if code]
        if failed:
            print(f"[rollout_study] scoring failed: {', '.join(failed)} (logs in {a.out / 'scores'})", flush=True)
            status = 1
        if todo:
            calls.append({"phase": f"score phase: {len(todo)} checkpoints, {jobs} at once, on {where(False)}, wall",
                          "command": this, "seconds": time.monotonic() - started})
    calls_file.write_text(json.dumps(calls, indent=1))
    if "report" in a.phases and done and not failed:
        phases = []
        for r in done:
            record = json.loads(r.record.read_text())
            phases.append({"phase": f"train {label(r)}", "command": "python3 " + record["command"],
                           "seconds": record["seconds"] or 0.0})
        (a.out / f"phases.{a.tag}.json").write_text(json.dumps(phases + calls, indent=1))
        status = subprocess.run(report_command(a, done, vllm_mode), cwd=REPO).returncode or status
    return status


if __name__ == "__main__":
    sys.exit(main())
