"""What every study notebook does first, in one call."""

from __future__ import annotations

from ..store.models import load_model, load_tokenizer
from ..studies.profiles import Profile
from ..studies.profiles import profile as named_profile
from . import plots


def setup(profile: str, model_name: str | None = None) -> tuple[Profile, str, object, object]:
    """The figure style, the profile's settings, and its model (or ``model_name``) with its tokenizer:
    ``prof, model_name, model, tokenizer = setup(profile, model_name)``."""
    plots.use_style()
    prof = named_profile(profile)
    model_name = model_name or prof.model
    return prof, model_name, load_model(model_name), load_tokenizer(model_name)
