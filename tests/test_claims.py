"""The claims ledger (results/claims.csv): what the stored tables say, row by row, in one vocabulary."""

import math
import numbers

import pandas as pd
import pytest

from lpes_nb.store.results import project_root
from lpes_nb.studies import claims

RESULTS = project_root() / "results"


@pytest.fixture(scope="module")
def committed() -> pd.DataFrame:
    return claims.read(RESULTS / "claims.csv")


def test_the_committed_ledger_is_what_the_store_gives():
    """A change behind a stored table (or in the ledger) without `lpes claims` fails here."""
    fresh = claims.ledger(RESULTS)
    assert fresh.to_csv(index=False) == (RESULTS / "claims.csv").read_text()


def test_the_ledger_has_every_column_twenty_rows_and_one_vocabulary(committed):
    assert list(committed.columns) == claims.COLUMNS and len(committed) >= 20
    assert committed.verdict.str.startswith(claims.VERDICTS).all()
    reasoned = ~committed.verdict.str.startswith(("reproduced", "opposite", "not reproduced"))
    assert committed.verdict[reasoned].str.contains(" — ").all()  # not comparable / not run / withdrawn say why
    numbered = committed.ours.notna()
    assert (committed.ci_low[numbered] < committed.ci_high[numbered]).all()  # never of zero width
    assert committed.interval[numbered].ne("").all() and committed.n[numbered].gt(0).all()
    assert committed.ours[committed.verdict.str.startswith("withdrawn")].isna().all()  # a withdrawn number is not shown


def numbers_of(row) -> list[float]:
    return [float(v) for v in row if isinstance(v, numbers.Real) and not isinstance(v, bool) and not math.isnan(v)]


def holds(values: list[float], triple: list[float]) -> bool:
    return any(all(math.isclose(w, v, rel_tol=1e-9, abs_tol=1e-9) for w, v in zip(triple, values[i:i + 3]))
               for i in range(len(values) - 2))


def test_every_number_is_one_row_of_its_source_table(committed):
    """Read independently of the ledger's code: each row's estimate, interval and n are one row of the
    table it names (accuracy differences stored as fractions appear in points; a latency's n is its
    study's, not its row's)."""
    assert committed.ours.notna().sum() >= 15
    for row in committed[committed.ours.notna()].itertuples():
        source = pd.read_csv(RESULTS / row.source)
        scale = 100.0 if row.source == "position_deficits.csv" and row.unit == "points" else 1.0
        triple = [row.ours / scale, row.ci_low / scale, row.ci_high / scale]  # stored side by side: estimate, low, high
        hits = [r for r in source.itertuples(index=False) if holds(numbers_of(r), triple)
                and (not row.interval.startswith("95 %") or any(math.isclose(row.n, v) for v in numbers_of(r)))]
        assert len(hits) == 1, (row.claim, row.source)


def test_the_papers_numbers_come_from_their_tables():
    assert claims.paper_gain("Qwen2.5-7B", "LPES (Ours)", "mdqa") == pytest.approx(3.36)
    assert claims.paper_gain("Qwen2.5-7B", "LPES (Ours)", "mdqa", "Positional Interpolation") == pytest.approx(3.36)
    table4 = claims.paper_table4()
    assert table4["MoICE"] / table4["Baseline"] == pytest.approx(2.42, abs=0.005)  # the paper's "2.42x faster than MoICE"
    assert table4["Ms-PoE"] / table4["Baseline"] == pytest.approx(1.45, abs=0.005)
    with pytest.raises(KeyError, match="no row Qwen2.5-7B / LASP / mdqa"):
        claims.paper_average("Qwen2.5-7B", "LASP", "mdqa")


def test_a_method_variant_that_is_not_the_authors_code_is_not_held_against_the_paper(tmp_path):
    table = RESULTS / "lpes_at_power" / f"claims_mdqa20_{claims.QWEN}_bfloat16.csv"
    rows = pd.read_csv(table).head(1).assign(method="Ms-PoE (rank, endpoints grid)", verdict="no paper figure; ours: lower")
    (tmp_path / "lpes_at_power").mkdir()
    rows.to_csv(tmp_path / table.relative_to(RESULTS), index=False)
    (row,) = claims.lpes_test_rows(tmp_path)
    assert row["verdict"] == ("not comparable — ours ran Ms-PoE (rank, endpoints grid), not the authors' code's Ms-PoE; "
                              "ours: lower") and row["paper_value"] == ""
    rows.assign(method="Ms-PoB").to_csv(tmp_path / table.relative_to(RESULTS), index=False)
    with pytest.raises(ValueError, match="no paper claim is known for method 'Ms-PoB'"):
        claims.lpes_test_rows(tmp_path)


def test_a_verdict_outside_the_vocabulary_is_refused():
    with pytest.raises(ValueError, match="verdict 'better' starts with none of"):
        claims._row(claim="x", verdict="better")


def test_the_readme_findings_table_is_the_ledger(committed):
    text = (RESULTS.parent / "README.md").read_text()
    assert text.index("<!-- generated: findings") < 1500  # on the first screen, after the three-line introduction
    table = claims.findings_table(committed)
    assert table in text and table.count("\n") >= 10
