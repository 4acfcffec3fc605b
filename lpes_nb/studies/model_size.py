"""Notebook 9: does the position curve change with model size? The unmodified Qwen2.5-Coder models
(0.5B and 1.5B: the same tokenizer, RoPE base, window and chat template, so they differ in size alone)
on the same records of one record cell, paired by record (:func:`position_gate.size_differences`: each
position, the average over positions and ends − middle, one Holm family per pair and score), beside
the paper's 7B curve. The larger model's map grows over many sittings; it is compared on the records
it has, and every verdict carries its n and MDE."""

from __future__ import annotations

import pandas as pd

from ..evaluation.position_gate import size_differences, verdict_word
from ..store.models import QWEN, QWEN_15B, model_label
from ..store.results import output_dir, write_csv
from .lpes_at_power import SHORT, SHORT_WORDS, with_short_answers
from .position_map import positional_rows, record_summary
from .profiles import PositionMap

FAMILY = (QWEN, QWEN_15B)  # smallest first
# accuracy as the original evaluation judges it (the whole first line), the length check (MDQA: the first
# SHORT_WORDS words: a larger model that writes longer first lines gains from length alone), the gold log-prob
# name, scale, unit, decimals: nats to 2, as notebook 9's cells print them (to 1, an interval from +0.05 read "+0.0")
SCORES = {"correct": ("accuracy", 100.0, "points", 1), SHORT: (f"accuracy, first {SHORT_WORDS} words", 100.0, "points", 1),
          "gold_logprob": ("gold log-prob", 1.0, "nats", 2)}


def size_cells(spec: PositionMap, records: dict[str, pd.DataFrame]) -> dict[tuple[str, str, int], dict[str, pd.DataFrame]]:
    """The record cells that more than one model of :data:`FAMILY` holds, by (dtype, task, items):
    model -> its positional rows (with ``gold_withdrawn`` cells' NaN gold columns as they are)."""
    groups: dict[tuple[str, str, int], dict[str, pd.DataFrame]] = {}
    for cell in spec.record_cells:
        if cell.model in FAMILY:
            frame = records[cell.name]
            groups.setdefault((frame.dtype.iloc[0], cell.task, cell.items), {})[cell.model] = positional_rows(frame)
    return {key: dict(sorted(models.items(), key=lambda m: FAMILY.index(m[0]))) for key, models in groups.items() if len(models) > 1}


def size_table(spec: PositionMap, records: dict[str, pd.DataFrame], profile: str) -> pd.DataFrame:
    """Each larger model against the next smaller one, on the larger model's records, per shared cell
    and score (:data:`SCORES`: accuracy; on MDQA the length check; the gold log-prob where both cells
    have it), written to ``position_size_differences.csv``."""
    frames = []
    for (dtype, task, items), cells in size_cells(spec, records).items():
        models = list(cells)
        pairs = list(zip(models[1:], models[:-1]))
        if task == "mdqa":
            cells = with_short_answers(cells, items=items)
        for value in SCORES:
            if value not in next(iter(cells.values())) or (value == "gold_logprob"
                                                             and not all(df[value].notna().all() for df in cells.values())):
                continue  # KV has no length check; a cell whose gold scores are withdrawn is compared on accuracy only
            frames.append(size_differences(cells, pairs, value).assign(cell=f"{task}-{items}", dtype=dtype))
    if not frames:
        raise ValueError(f"no record cell is held by two models of {FAMILY}; the profile's cells: "
                         f"{[c.name for c in spec.record_cells]}")
    table = pd.concat(frames, ignore_index=True)
    write_csv(output_dir("results", profile) / "position_size_differences.csv", table.round(5))
    return table


def size_summaries(cells: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Accuracy by position with Wilson intervals of each model of one shared cell (:func:`size_cells`),
    on the records the largest model holds (the pairing the differences use)."""
    on = set(cells[list(cells)[-1]]["record"])
    return {model: record_summary(frame[frame["record"].isin(on)]) for model, frame in cells.items()}


def size_conclusion(table: pd.DataFrame) -> str:
    """Per shared cell, score and pair: the average and the ends − middle difference, each with its
    interval, n, MDE and Holm verdict, and what the latter says about the middle deficit."""
    lines = ["- Intervals: 95 %, paired and clustered by record, unadjusted; each verdict from the Holm-adjusted test "
             "(one family per pair and score)."]
    for (cell, value, larger, smaller), rows in table.groupby(["cell", "value", "method", "reference"], sort=False):
        name, scale, unit, digits = SCORES[value]
        rows = rows.set_index("position")
        n = int(rows["n"].iloc[0])

        def said(row) -> str:
            word = verdict_word(row.difference, row.ci_low, row.ci_high, row.p_holm, row.mde, unit=scale, digits=digits, suffix=f" {unit}")
            return (f"{scale * row.difference:+.{digits}f} {unit} [{scale * row.ci_low:+.{digits}f}, {scale * row.ci_high:+.{digits}f}], "
                    f"Holm p {row.p_holm:.3g}: {word}")  # 3 significant digits: 0.0498 must not print as 0.050
        shape = rows.loc["ends − middle"]
        deficit = ("deeper in the larger model" if shape.verdict.startswith("higher")
                   else "shallower in the larger model" if shape.verdict.startswith("lower")
                   else "not different between the sizes at this n")
        pair = f"{model_label(larger, rows['dtype'].iloc[0])} − {model_label(smaller, rows['dtype'].iloc[0])}"
        lines.append(f"- **{cell.upper()}, {name}**: {pair} (n = {n} records, paired): average over positions "
                     f"{said(rows.loc['average'])}; ends − middle {said(shape)} — the middle deficit is {deficit}.")
    return "\n".join(lines)
