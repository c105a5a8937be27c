import pytest

from hf_lightning.callbacks.best_model import resolve_monitor
from hf_lightning.core.errors import ConfigError


@pytest.mark.parametrize(
    "name,greater,expected",
    [
        ("eval_loss", None, ("val/loss", "min")),
        ("loss", None, ("val/loss", "min")),
        ("eval_accuracy", True, ("val/accuracy", "max")),
        ("val/perplexity", False, ("val/perplexity", "min")),
        ("eval_loss", True, ("val/loss", "max")),
    ],
)
def test_hf_names_map_to_lightning_monitor(name, greater, expected):
    assert resolve_monitor(name, greater) == expected


def test_non_loss_metric_needs_an_explicit_direction():
    with pytest.raises(ConfigError, match="metric_for_best_model='eval_accuracy' does not end in 'loss'"):
        resolve_monitor("eval_accuracy")
