"""What every study notebook does first, in one call."""

from __future__ import annotations

from . import plots, tasks
from .models import load_model, load_tokenizer


def setup(profile: str, model_name: str | None = None):
    """The figure style, the profile's settings, and its model (or ``model_name``) with its tokenizer:
    ``prof, model_name, model, tokenizer = setup(profile, model_name)``."""
    plots.use_style()
    prof = tasks.profile(profile)
    model_name = model_name or prof["model"]
    return prof, model_name, load_model(model_name), load_tokenizer(model_name)
