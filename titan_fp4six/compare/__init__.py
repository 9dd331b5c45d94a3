"""Paired multi-seed comparison of a four-over-six recipe with its bf16 and plain-NVFP4 twins.

``python -m titan_fp4six.compare --job.config_file RECIPE --seeds 5 --steps N`` derives the twins
(``variants``), trains every (variant, seed) with torchtitan's deterministic settings through the plugin's
launcher (``runs``), and reports final losses, paired gaps to bf16 with 95% intervals over seeds and the
fraction of NVFP4's gap that 4/6 closes (``stats``) as markdown, JSON and a plot (``report``). It launches the
trainer as a subprocess and never imports torchtitan itself.
"""
