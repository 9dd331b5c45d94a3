"""The integration for torchtitan 0.3.x: converter configs (converters), the trainer with the plugin's CLI sections
(trainer), registry functions of the recipes (config_registry: `--module titan_fp4six.integration.tt03 --config
<recipe>`) and the CPU adjustments (cpu). Everything below integration/ is shared with the 0.2 integration."""

from ..version import require

require("0.3", "titan_fp4six.integration.tt03")
