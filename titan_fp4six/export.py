"""``python -m titan_fp4six.export``: a torchtitan checkpoint as a Hugging Face folder.

    python -m titan_fp4six.export --job.config_file RECIPE --checkpoint DIR --out OUT [--format bf16|nvfp4]
        [--section.key value ...]

What each format holds and what is refused before anything is written: titan_fp4six/integration/export.py.
Needs torchtitan 0.2.x.
"""

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from titan_fp4six.integration import export  # refuses torchtitan 0.3 by name (version.require)

    parser = argparse.ArgumentParser(prog="python -m titan_fp4six.export", description="A torchtitan checkpoint as a "
                                     "Hugging Face folder: bf16, or nvfp4 (the training forward's weights, served by "
                                     "the package's vLLM plugin). The torchtitan CLI follows: --job.config_file ...")
    parser.add_argument("--checkpoint", type=Path, required=True, help="a torchtitan DCP folder (step-N)")
    parser.add_argument("--out", type=Path, required=True, help="a new (or empty) folder")
    parser.add_argument("--format", default="bf16", help=f"one of {', '.join(export.FORMATS)}")
    ours, rest = parser.parse_known_args(argv)
    if "--job.config_file" not in rest:
        parser.error("--job.config_file RECIPE.toml is required (the recipe that trained the checkpoint)")
    from torchtitan.config import ConfigManager

    job_config = ConfigManager().parse_args(rest)
    out = export.export(job_config, ours.checkpoint, ours.out, ours.format)
    print(f"wrote {out}: config.json, {', '.join(export.TOKENIZER_FILES)}, model.safetensors ({ours.format})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
