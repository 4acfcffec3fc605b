"""One named split of every real data set, in one table (:data:`SPLIT`): which records a search, its
validation and its test may use, disjoint by construction.

The real 20-document MDQA records are only 441 (the lost-in-the-middle distractor sets available
offline), so they are budgeted: search 60, validation 60, test 321 (LPES is tested there at the power
to see a 3-point effect). Records are assigned to parts through one seeded permutation, so no part
inherits an ordering of the source file. The map of the unmodified model describes all 441 records
(its cell is fixed by the paper, not chosen from data), keyed by record, so its rows on the test part
are the test's baseline. The KV files (500 records each) are split the same way; the oracle file's
questions after the 441 are a pool of real passages for the other studies (a different, easier
setting where distractors are sampled: label it so). Generated tasks are split by seed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

SEED = 20261125
# dataset -> (number of records, ((part, size), ...)) in the order the permutation is cut
SIZES: dict[str, tuple[int, tuple[tuple[str, int], ...]]] = {
    "mdqa20": (441, (("search", 60), ("validation", 60), ("test", 321))),
    "kv75": (500, (("search", 100), ("validation", 100), ("test", 300))),
    "kv140": (500, (("search", 100), ("validation", 100), ("test", 300))),
}
FILES = {"mdqa20": ("mdqa", 20), "kv75": ("kv", 75), "kv140": ("kv", 140)}  # dataset -> task, items per record in the file
DESCRIPTIONS = {
    "mdqa20": "nq-open-20_total_documents_gold_at_0: 441 questions with 19 real retrieved distractors",
    "kv75": "kv-retrieval-75_keys: 500 records of 75 UUID pairs",
    "kv140": "kv-retrieval-140_keys: 500 records of 140 UUID pairs",
}


def _table() -> pd.DataFrame:
    rows = []
    for k, (dataset, (total, parts)) in enumerate(SIZES.items()):
        if sum(size for _, size in parts) != total:
            raise ValueError(f"the parts of {dataset} do not add up to its {total} records")
        order = np.random.default_rng([SEED, k]).permutation(total)
        start = 0
        for part, size in parts:
            rows += [{"dataset": dataset, "part": part, "record": int(r)} for r in sorted(order[start:start + size])]
            start += size
    return pd.DataFrame(rows)


SPLIT = _table()  # one row per (dataset, part, record id in the source file)


def records(dataset: str, part: str, n: int | None = None) -> list[int]:
    """The first ``n`` (default: all) record ids of ``part`` of ``dataset``, ascending; a clear error
    for an unknown name or more records than the part holds."""
    if dataset not in SIZES:
        raise ValueError(f"unknown dataset {dataset!r}; the split has {sorted(SIZES)}")
    parts = dict(SIZES[dataset][1])
    if part not in parts:
        raise ValueError(f"unknown part {part!r} of {dataset}; choose one of {list(parts)}")
    ids = SPLIT.loc[(SPLIT["dataset"] == dataset) & (SPLIT["part"] == part), "record"].tolist()
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(ids):
            raise ValueError(f"asked for n={n!r} records of {dataset}/{part}, which holds {len(ids)} (1..{len(ids)})")
        ids = ids[:n]
    return ids


def check_disjoint(split: pd.DataFrame = SPLIT) -> None:
    """Raise naming the records that two parts of one dataset share."""
    for dataset, rows in split.groupby("dataset"):
        owners = rows.groupby("record")["part"].unique()
        shared = owners[owners.map(len) > 1]
        if len(shared):
            raise ValueError(f"{dataset}: record {shared.index[0]} is in parts {list(shared.iloc[0])} "
                             f"({len(shared)} records in more than one part); parts must be disjoint")
