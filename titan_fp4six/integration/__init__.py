"""torchtitan integration (the only layer that imports torchtitan): TOML sections (job_config), converters,
metrics, embedded dataset (data) and CPU adjustments (cpu). Import submodules explicitly."""
