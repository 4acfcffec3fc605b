"""Files that are complete or absent: every result, checkpoint and converted model is written
through these, so a killed job never leaves half a file for the next sitting to read."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def atomic_write(path: Path | str, content: str | bytes) -> Path:
    """Write through a temporary file and a rename: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if isinstance(content, bytes) else "w") as f:
            f.write(content)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; results are for everyone who reads the folder
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@contextmanager
def atomic_directory(target: Path | str) -> Iterator[Path]:
    """A fresh directory beside ``target`` to fill; it becomes ``target`` when the block ends without
    an error and is deleted otherwise (a converted model is complete or absent, never half there)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
