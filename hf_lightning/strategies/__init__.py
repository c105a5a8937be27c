"""Where a strategy is chosen: the builders that ``conf/strategy/*.yaml`` name as ``_target_``.

Each builder takes plain arguments (the config keys) and returns a Lightning strategy; what it derives from
the rest of the config (micro-batch, accumulation, clipping, precision) is passed in by interpolation, so the
YAML can never disagree with the Trainer.
"""

from hf_lightning.strategies.deepspeed import HFDeepSpeedStrategy, deepspeed_config, deepspeed_strategy
from hf_lightning.strategies.fsdp import HFFSDPStrategy, NoSplitModulesPolicy, fsdp_strategy, shard_module
from hf_lightning.strategies.launch import refuse_multirun_relaunch, relaunches_command_line

__all__ = [
    "HFDeepSpeedStrategy",
    "HFFSDPStrategy",
    "NoSplitModulesPolicy",
    "deepspeed_config",
    "deepspeed_strategy",
    "fsdp_strategy",
    "refuse_multirun_relaunch",
    "relaunches_command_line",
    "shard_module",
]
