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


def head(table, source: str, rows: int = 10):
    """A long table as its first ``rows`` rows, saying how many it has and where the whole lives
    (``source``: its file in the store, or what it is computed from), so that a committed notebook
    stays readable on a code host; a short table is returned whole."""
    if len(table) > rows:
        print(f"the first {rows} of {len(table)} rows; the whole table: {source}")
    return table.head(rows)
