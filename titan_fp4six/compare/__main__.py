"""``python -m titan_fp4six.compare --job.config_file RECIPE --seeds 5 --steps N [options] [trainer overrides]``

Trains the 4/6 recipe, its bf16 twin, its plain-NVFP4 twin and any ``--variant`` for every seed with
deterministic settings, then writes compare.md, compare.json and compare.png to --out. Arguments this parser
does not know go to every run's trainer command line (e.g. ``--training.seq_len 512``). Re-running the same
command trains only the runs that have not finished; ``--report-only`` rebuilds the outputs from the logs.
"""

import argparse
import fcntl
import json
import os
import shlex
import signal
import sys
from pathlib import Path

import tomli

from .report import markdown, plot, read_outcome, summarize, to_json
from .runs import Job, Scheduler, command, device_memory_gib
from .variants import BF16, derive, dumps, load_recipe, sets_compare_key


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="python -m titan_fp4six.compare", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job.config_file", dest="config", required=True, help="the 4/6 recipe (TOML)")
    p.add_argument("--seeds", type=int, default=5, help="seeds per variant (>= 2; default 5)")
    p.add_argument("--seed-start", type=int, default=0, help="first seed (seeds are consecutive)")
    p.add_argument("--steps", type=int, help="training steps of every run (default: the recipe's)")
    p.add_argument("--tail", type=int, help="final loss = mean of the last TAIL steps (default: steps // 5)")
    p.add_argument("--variant", action="append", default=[],
                   help="extra variant 'NAME=BASE [knob=value ...] [--section.key value ...]', BASE one of "
                        "bf16, nvfp4, 4/6 or an earlier --variant (e.g. 'nvfp4 B256=nvfp4 scale_bound=256')")
    p.add_argument("--only", help="comma-separated variant names to run (must include bf16)")
    p.add_argument("--out", type=Path, help="output folder (default outputs/compare/<recipe name>)")
    p.add_argument("--bf16-from", type=Path, metavar="DIR",
                   help="the bf16 runs live in DIR, the --out of a comparison of another recipe with the same bf16 "
                        "twin (recipes that differ only in what they quantize): read there, trained there if "
                        "missing, so a study of several such recipes trains bf16 once")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="most runs at once on a GPU (default: the CPU count; memory permitting); CPU: 1")
    p.add_argument("--timeout", type=float, default=7200, help="seconds before a run is stopped (reported failed)")
    p.add_argument("--spike-factor", type=float, default=5.0,
                   help="a grad-norm spike is a step above FACTOR x the median of the 50 steps before it")
    p.add_argument("--report-only", action="store_true", help="read the logs in --out, train nothing")
    p.add_argument("--no-plot", action="store_true", help="skip compare.png (no matplotlib needed)")
    args, trainer = p.parse_known_args(argv)
    try:
        recipe = load_recipe(args.config)
        args.variants = derive(recipe, args.variant, args.only.split(",") if args.only else None)
    except (OSError, ValueError) as e:  # a recipe or --variant/--only that cannot be compared: say so, no traceback
        p.error(str(e))
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps {args.steps}: give a positive number of steps")
    if args.steps is None:
        args.steps = recipe.get("training", {}).get("steps")
        if type(args.steps) is not int or args.steps < 1:
            p.error(f"--steps: give a positive number of steps (the recipe's training.steps is {args.steps!r})")
    if args.tail is None:
        args.tail = max(1, args.steps // 5)
    if not 1 <= args.tail <= args.steps:
        p.error(f"--tail {args.tail}: must be between 1 and --steps ({args.steps})")
    if args.seeds < 2:
        p.error(f"--seeds {args.seeds}: intervals over seeds need at least 2 (5 or more for useful ones)")
    if args.jobs < 1:
        p.error(f"--jobs {args.jobs}: must be >= 1")
    if not args.timeout > 0:
        p.error(f"--timeout {args.timeout}: seconds before a run is stopped, must be > 0")
    taken = sets_compare_key(trainer)
    if taken:
        p.error(f"{taken}: --training.steps / --debug.seed are set by compare: use --steps and --seeds/--seed-start")
    args.out = args.out or Path("outputs/compare") / Path(args.config).stem
    return args, trainer


def plan(args, trainer: list[str]) -> tuple[list, list[Job]]:
    variants = args.variants
    home = {v.name: args.bf16_from if v.name == BF16 and args.bf16_from else args.out for v in variants}
    shared = {name for name, folder in home.items() if folder != args.out}
    configs = {}
    for v in variants:
        configs[v.name] = home[v.name] / "variants" / f"{v.slug}.toml"
        if v.name in shared:
            _check_same_training(configs[v.name], v.recipe)
        else:
            _check_same_variant(configs[v.name], v.recipe, args.out)
        if not args.report_only and not (v.name in shared and configs[v.name].is_file()):  # the other folder's stays
            configs[v.name].parent.mkdir(parents=True, exist_ok=True)
            configs[v.name].write_text(f"# compare variant {v.name!r} of {args.config}\n" + dumps(v.recipe))
    jobs = []  # seed-major: a comparison stopped early leaves whole seeds, which pair
    for seed in range(args.seed_start, args.seed_start + args.seeds):
        for v in variants:
            name = f"{v.slug}_seed{seed}"
            cmd = command(configs[v.name], seed, args.steps, home[v.name] / "dump" / name, trainer, v.overrides)
            job = Job(v.name, seed, cmd, home[v.name] / "runs" / f"{name}.log")
            if v.name in shared and job.log.is_file():
                with open(job.log) as f:
                    theirs = f.readline()
                if theirs != job.header():  # an unfinished run of the same command is trained again, as here
                    raise SystemExit(f"--bf16-from {args.bf16_from}: its {job.log.name} is another command's run, "
                                     f"which training it here would replace; that run: {theirs.strip()}; this "
                                     f"one: {job.header().strip()}")
            jobs.append(job)
    return variants, jobs


def _check_same_variant(path: Path, recipe: dict, out: Path) -> None:
    """--out's runs of a variant were trained from its TOML: another recipe under the same name is refused (its
    runs would be reported as this one's)."""
    if path.is_file() and path.read_text().split("\n", 1)[1] != dumps(recipe):
        raise SystemExit(f"--out {out} holds a comparison whose variant {path.stem!r} is another recipe ({path}); "
                         "its runs are not this comparison's: pass a new --out (or the same recipe and variants)")


def _lock(out: Path):
    """Hold --out for this invocation: two comparisons in one folder would train the same runs into one log."""
    out.mkdir(parents=True, exist_ok=True)
    handle = open(out / ".lock", "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(f"--out {out}: another compare is running there; wait for it or pass another --out") from None
    return handle


def _check_same_training(path: Path, recipe: dict) -> None:
    """A shared variant's TOML already in the other folder must be this recipe's but for the job's texts."""
    if not path.is_file():
        return
    with open(path, "rb") as f:
        theirs = tomli.load(f)
    ours = json.loads(json.dumps(recipe))
    for doc in (theirs, ours):
        for key in ("description", "dump_folder"):
            doc.get("job", {}).pop(key, None)
    if theirs != ours:
        keys = sorted(f"{s}.{k}" for s in {*theirs, *ours} for k in {*theirs.get(s, {}), *ours.get(s, {})}
                      if theirs.get(s, {}).get(k) != ours.get(s, {}).get(k))
        raise SystemExit(f"--bf16-from: {path} is another training than this recipe's bf16 twin (differs in "
                         f"{', '.join(keys)}): its runs cannot stand in for this comparison's")


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the scheduler stops its runs (timeout, kill)
    args, trainer = parse_args(sys.argv[1:] if argv is None else argv)
    lock = _lock(args.out)  # noqa: F841  (held until the process ends)
    variants, jobs = plan(args, trainer)
    if not args.report_only:
        device = device_memory_gib()
        where = f"one GPU ({device:.0f} GiB), up to {args.jobs} at once" if device else "the CPU, one at a time"
        print(f"[compare] {len(jobs)} runs ({len(variants)} variants x {args.seeds} seeds, {args.steps} steps) "
              f"on {where}; logs in {args.out / 'runs'}", flush=True)
        Scheduler(args.jobs, device, args.timeout).run(jobs)
    outcomes = [read_outcome(j, args.steps, args.tail, args.spike_factor) for j in jobs]
    names = [v.name for v in variants]
    summaries = summarize(outcomes, names)
    setup = (f"`python -m titan_fp4six.compare {shlex.join(sys.argv[1:] if argv is None else argv)}`: "
             f"{args.seeds} seeds from {args.seed_start}, {args.steps} steps, final loss = mean of the last "
             f"{args.tail} steps; intervals are 95% Student t over seeds, gaps paired by seed.")
    text = markdown(summaries, outcomes, setup)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compare.md").write_text(text)
    meta = {"recipe": str(args.config), "seeds": args.seeds, "seed_start": args.seed_start, "steps": args.steps,
            "tail": args.tail, "trainer_overrides": trainer, "variants": {v.name: v.overrides for v in variants}}
    (args.out / "compare.json").write_text(to_json(summaries, outcomes, meta))
    if not args.no_plot:
        plot(outcomes, names, args.steps, args.out / "compare.png", Path(args.config).stem)
    print(text, flush=True)
    return 1 if any(o.status in ("failed", "not run") for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
