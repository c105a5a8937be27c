"""The config side of the entry points: the one builder (:mod:`~hf_lightning.config.build`), the schema pass
that checks a composed config before anything is built (:mod:`~hf_lightning.config.schema`, with the HF
``TrainingArguments`` names of :mod:`~hf_lightning.config.hf_names`), the command-line group precedence
(:mod:`~hf_lightning.config.choices`), the optional packages (:mod:`~hf_lightning.config.optional`) and the
Hydra callback that summarises a sweep. The library itself imports only :mod:`~hf_lightning.config.optional`
from here, when a model or a strategy needs a package that may be missing."""

from hf_lightning.config.schema import validate_config

__all__ = ["validate_config"]
