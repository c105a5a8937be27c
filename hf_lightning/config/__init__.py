"""The config side of the entry points: the schema pass that checks a composed config before anything is
built, and the Hydra callback that summarises a sweep. The library itself never imports this package."""

from hf_lightning.config.schema import validate_config

__all__ = ["validate_config"]
