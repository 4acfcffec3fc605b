"""One-off: re-key the stored results whose parameters hold numpy reprs (lpes_nb.results.migrate_store).

Usage: python scripts/migrate_store.py [results-directory ...]   (default: results/ and its profiles)"""

import sys
from pathlib import Path

from lpes_nb.results import migrate_store, project_root

dirs = [Path(d) for d in sys.argv[1:]] or [project_root() / "results", *sorted(p for p in (project_root() / "results").iterdir() if p.is_dir())]
for d in dirs:
    for old, new in migrate_store(d):
        print(f"{d}: {old} -> {new}")
