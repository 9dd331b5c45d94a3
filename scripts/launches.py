"""Every four-over-six quantize launch of a training run against its plain-NVFP4 twin on the same bytes (GPU).

    python -m scripts.launches OUT RECIPE [--steps 8] [--rounds 2] [--docs] [-- TRAINING_FLAGS]

Trains RECIPE for --steps in this process (`titan_fp4six.train`, metrics logged every step, so the forward's
operands count their map-to-4 blocks as a logged step does) with the quantize kernel's launcher wrapped: each 4/6
launch is followed by its twin (map-to-6 only, scale bound 448, the same layout and decode, and counted where the
4/6 launch is, as the plain recipe's kernel counts its zeros) on the same input, each bracketed by CUDA events. So
the ratios are in place, on training's own bytes and cache state, with no host sync added; training's bytes do not
change (the twin writes its own outputs and draws no seed). Then the largest input of each layout and column count
(after its first launch) is replayed: as run, without the count, and as its twin, counted alike (the least of
--rounds medians). A profile
pair cannot give these ratios per launch: its two runs route tokens differently, so a grouped op's launch of one
grid is another layer's call in each run.

Writes OUT/launches.md (both tables); --docs also writes them into docs/results/speed.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

import torch

from scripts import results_page
from titan_fp4six.quant.recipe import PLAIN_NVFP4

SPEED_PAGE = "speed.md"
_SLEEP_CYCLES = 2_000_000  # ~1 ms of GPU spin ahead of each timed pair: far longer than the host takes to queue it


@dataclasses.dataclass
class Timed:
    """One 4/6 launch timed in place: its layout, its input's columns, the CUDA events around it and its twin."""
    layout: str
    cols: int
    compiled: bool  # a kernel compiled inside the pair (its bracket holds the compile): left out of the table
    events: tuple  # (4/6 start, 4/6 end, twin start, twin end)

    def ms(self) -> tuple[float, float]:
        a, b, c, d = self.events
        return a.elapsed_time(b), c.elapsed_time(d)


def layout_of(x, spec, transposed: bool, groups, map4, token_blocks) -> str:
    """How a launch reads its operand, in the layouts benchmark's words (rows, 16x16 tiles, columns, token
    blocks), and whether it counts map-to-4 blocks (a logged step's forward operands)."""
    if token_blocks is not None:
        name = "token blocks"
    elif transposed:
        name = "columns"
    else:
        name = "16x16 tiles" if spec.block == "16x16" else "rows"
        name += ", per-group amax" if groups is not None else ""
    return name + (", counted" if isinstance(map4, torch.Tensor) else "")


def twin_of(spec):
    """The plain NVFP4 full recipe's spec for the same operand (numerics.spec.OperandSpec): map-to-6 only,
    the scale bound of quant.recipe.PLAIN_NVFP4, every other field kept."""
    return dataclasses.replace(spec, candidates="6", scale_bound=PLAIN_NVFP4["scale_bound"])


def in_place_table(rows: list[tuple[str, int, bool, float, float]]) -> str:
    """rows: (layout, columns, compiled, 4/6 ms, twin ms) per launch -> per layout and columns, then for all: launches,
    both kernels' total ms, their ratio and the range of the per-launch ratios (pairs that compiled left out).

    The ratio is of the totals: the pair's order alternates, so each kernel runs second (maybe from L2) in half
    the pairs, and a per-launch median of such alternating ratios would pick one order's."""
    groups: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for layout, cols, compiled, fos, twin in rows:
        if not compiled and twin > 0:
            groups.setdefault((layout, cols), []).append((fos, twin))
    lines = ["| layout | x's columns | launches | 4/6 ms | NVFP4 ms | 4/6 / NVFP4 | per launch |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for (layout, cols), times in sorted(groups.items(), key=lambda kv: -sum(f - t for f, t in kv[1])):
        ratios = [f / t for f, t in times]
        fos, twin = sum(f for f, _ in times), sum(t for _, t in times)
        lines.append(f"| {layout} | {cols} | {len(times)} | {fos:.2f} | {twin:.2f} | {fos / twin:.2f}x | "
                     f"{min(ratios):.2f}-{max(ratios):.2f}x |")
    every = [pair for times in groups.values() for pair in times]
    if every:
        fos, twin = sum(f for f, _ in every), sum(t for _, t in every)
        lines.append(f"| **all** | | {len(every)} | {fos:.2f} | {twin:.2f} | {fos / twin:.2f}x | |")
    return "\n".join(lines)


def replay_table(rows: list[tuple[str, tuple[int, int], float, float, float]]) -> str:
    """rows: (layout, shape, as run ms, uncounted ms, twin ms) -> the replay table with the ratios to the twin."""
    lines = ["| layout | shape | as run ms | without the count ms | NVFP4 ms (counted alike) | as run / NVFP4 | "
             "uncounted / NVFP4 |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for layout, (m, k), run, uncounted, twin in rows:
        lines.append(f"| {layout} | {m}x{k} | {run:.3f} | {uncounted:.3f} | {twin:.3f} | {run / twin:.2f}x | "
                     f"{uncounted / twin:.2f}x |")
    return "\n".join(lines)


class Recorder:
    """Wraps kernels.quantize._launch for one run: times each 4/6 launch and its twin in place, keeps the largest
    input of each (layout, columns) after its first launch for the replay (a column count's launches mix shapes:
    the largest holds most of their time)."""

    def __init__(self, kq):
        self.kq, self.launch = kq, kq._launch
        self.timed: list[Timed] = []
        self.seen: dict[tuple, int] = {}  # launches so far per (layout, columns)
        self.captured: dict[tuple[str, int], dict] = {}
        self.twin_counts = None  # the twins' count buffer (never read: the plain kernel counts zeros)

    def __enter__(self):
        from titan_fp4six.kernels import launch

        fast = self.kq._QUANTIZE
        if fast._kinds is None or not fast._direct or launch._hooks_installed():
            raise SystemExit("scripts.launches tells a compile inside a timed pair by FastLaunch's cache growing: it "
                             f"needs FastLaunch's direct launch (triton {launch.DIRECT_TRITON}*, compiled, no hooks)")
        self.kq._launch = self._wrapped
        return self

    def __exit__(self, *exc):
        self.kq._launch = self.launch

    def _wrapped(self, x, amax, spec, decode, transposed=False, check_amax=False, groups=None, map4=True, seed=None,
                 token_blocks=None):
        args = dict(x=x, amax=amax, spec=spec, decode=decode, transposed=transposed, check_amax=check_amax,
                    groups=groups, map4=map4, seed=seed, token_blocks=token_blocks)
        if spec.candidates != "4/6":  # plain NVFP4 and map-to-6-only operands have no choice to time
            return self.launch(**args)
        layout = layout_of(x, spec, transposed, groups, map4, token_blocks)
        key = (layout, x.shape[1])
        counted = isinstance(map4, torch.Tensor)
        if counted and self.twin_counts is None:
            self.twin_counts = torch.zeros_like(map4)
        twin = {**args, "spec": twin_of(spec), "map4": self.twin_counts if counted else False, "check_amax": False}
        kernels = len(self.kq._QUANTIZE._compiled)
        n = self.seen[key] = self.seen.get(key, 0) + 1
        # Alternate which runs first (the second may find the first's input in L2), and keep the GPU busy while
        # the host queues both, so that neither bracket holds host time.
        runs = (args, twin) if n % 2 else (twin, args)
        events = tuple(torch.cuda.Event(enable_timing=True) for _ in range(4))
        torch.cuda._sleep(_SLEEP_CYCLES)
        events[0].record()
        out_a = self.launch(**runs[0])
        events[1].record()
        events[2].record()
        out_b = self.launch(**runs[1])
        events[3].record()
        compiled = len(self.kq._QUANTIZE._compiled) > kernels  # Triton specializes on shapes: any launch may
        self.timed.append(Timed(layout, x.shape[1], compiled, events if n % 2 else events[2:] + events[:2]))
        kept = self.captured.get(key)
        if n > 1 and (kept is None or x.numel() > kept["x"].numel()):  # after the first launch: data past step 1
            self.captured[key] = {**args, "x": x.detach().clone(), "amax": amax.clone(), "check_amax": False,
                                  "groups": None if groups is None else groups._replace(
                                      group_of_row=groups.group_of_row.clone()),
                                  "token_blocks": None if token_blocks is None else token_blocks.clone()}
        return out_a if n % 2 else out_b

    def replay(self, rounds: int) -> list[tuple[str, tuple[int, int], float, float, float]]:
        from scripts.bench import _least_of_rounds

        fns = {}
        for key, args in self.captured.items():
            if isinstance(args["map4"], torch.Tensor):  # a count buffer of its own, allocated outside the timing
                args["map4"] = torch.zeros_like(args["map4"])
            fns[key, "run"] = lambda a=args: self.launch(**a)
            fns[key, "uncounted"] = lambda a=args: self.launch(**{**a, "map4": False})
            fns[key, "twin"] = lambda a=args: self.launch(**{**a, "spec": twin_of(a["spec"]), "map4": a["map4"]
                                                             if isinstance(a["map4"], torch.Tensor) else False})
        t = _least_of_rounds(fns, 50.0, rounds)
        return [(key[0], tuple(args["x"].shape), t[key, "run"], t[key, "uncounted"], t[key, "twin"])
                for key, args in self.captured.items()]


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """(this script's arguments, the training's flags): the flags are what follows the first "--"."""
    p = argparse.ArgumentParser(prog="python -m scripts.launches", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="folder for launches.md and the run's dump folder")
    p.add_argument("recipe", help="a 4/6 TOML recipe")
    p.add_argument("--steps", type=int, default=8, help="training steps")
    p.add_argument("--rounds", type=int, default=2, help="replay rounds; each time is the least median")
    p.add_argument("--docs", action="store_true", help=results_page.DOCS_HELP)
    split = argv.index("--") if "--" in argv else len(argv)
    return p.parse_args(argv[:split]), argv[split + 1:]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    command = f"python -m scripts.launches {shlex.join(argv)}"  # for --docs (training replaces sys.argv)
    args, flags = parse(argv)
    if not torch.cuda.is_available():
        raise SystemExit("scripts.launches times the CUDA quantize kernels: it needs a CUDA device")
    from titan_fp4six.kernels import quantize as kq
    from titan_fp4six.train import main as train

    with Recorder(kq) as recorder:
        train(["--job.config_file", args.recipe, *flags, "--training.steps", str(args.steps), "--metrics.log_freq",
               "1", "--job.dump_folder", str(args.out / "run")])
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    in_place = in_place_table([(t.layout, t.cols, t.compiled, *t.ms()) for t in recorder.timed])
    replay = replay_table(recorder.replay(args.rounds))
    text = f"{in_place}\n\nReplayed:\n\n{replay}\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "launches.md").write_text(text)
    print(text)
    if args.docs:
        results_page.write_section(SPEED_PAGE, "choice-launches", text, command)


if __name__ == "__main__":
    main(sys.argv[1:])
