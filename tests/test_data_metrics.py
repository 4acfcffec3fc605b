"""Prompts (character for character against the original templates), generators, metrics."""

import gzip
import json

import numpy as np
import pandas as pd
import pytest

from lpes_nb.store import data
from lpes_nb.store.data import (
    generate_kv,
    kv_prompt,
    kv_sample,
    load_kv,
    load_mdqa,
    mdqa_sample,
    passkey_sample,
    qa_prompt,
    text_windows,
    two_fact_sample,
)
from lpes_nb.evaluation.metrics import (
    accuracy_table,
    best_subspan_em,
    bootstrap_ci,
    kv_correct,
    mdqa_correct,
    mdqa_correct_within,
    normalize_answer,
    passkey_correct,
    perplexity,
    rank_agreement,
    spearman_interval,
    u_shape_rho,
)

needs_shared = pytest.mark.skipif(not (data.data_dir() / data.MDQA_FILE).is_file(), reason="shared data not present")


# --- prompts match the original templates --------------------------------------------------------


def test_qa_prompt_matches_the_original_template():
    docs = [{"title": "first doc", "text": "first doc text"}, {"title": "second doc", "text": "second doc text"}]
    prompt, spans = qa_prompt("test question", docs)
    gold = (
        "Write a high-quality answer for the given question using only the provided search results "
        "(some of which might be irrelevant).\n\n"
        "Document [1](Title: first doc) first doc text\nDocument [2](Title: second doc) second doc text"
        "\n\nQuestion: test question\nAnswer:"
    )
    assert prompt == gold
    assert [prompt[a:b] for a, b in spans] == ["Document [1](Title: first doc) first doc text",
                                              "Document [2](Title: second doc) second doc text"]


def test_kv_prompt_matches_the_original_template():
    pairs = [("test key1", "test value1"), ("test key2", "test value2"), ("test key3", "test value3")]
    prompt, spans = kv_prompt(pairs, "test key2")
    gold = "\n".join([
        "Extract the value corresponding to the specified key in the JSON object below.", "", "JSON data:",
        '{"test key1": "test value1",', ' "test key2": "test value2",', ' "test key3": "test value3"}', "",
        'Key: "test key2"', "Corresponding value:",
    ])
    assert prompt == gold
    assert [prompt[a:b] for a, b in spans] == [f'"{k}": "{v}"' for k, v in pairs]


@needs_shared
@pytest.mark.parametrize("num_docs", [10, 20])
def test_mdqa_gold_lands_exactly_at_every_index(num_docs):
    record = load_mdqa(limit=1)[0]
    gold = record["ctxs"][0]
    for index in range(num_docs):
        s = mdqa_sample(record, index, num_docs)
        docs = [s.prompt[a:b] for a, b in s.spans]
        assert len(docs) == num_docs
        assert docs[index] == f"Document [{index + 1}](Title: {gold['title']}) {gold['text']}"
        others = [d.split(") ", 1)[1] for i, d in enumerate(docs) if i != index]
        assert others == [c["text"] for c in record["ctxs"][1:num_docs]]  # distractors keep retrieval order
    assert s.answers == tuple(record["answers"])


@needs_shared
def test_original_kv_file_and_gold_placement():
    record = load_kv(limit=1)[0]
    assert len(record["ordered_kv_records"]) == 75
    for index in (0, 37, 74):
        s = kv_sample(record, index)
        assert s.prompt[slice(*s.spans[index])] == f'"{record["key"]}": "{record["value"]}"'
        assert s.prompt.endswith(f'Key: "{record["key"]}"\nCorresponding value:')


def test_generated_kv_is_reproducible_and_well_formed():
    a = generate_kv(20, 5, seed=3, key_format="letters6", value_format="digits4")
    assert a == generate_kv(20, 5, seed=3, key_format="letters6", value_format="digits4")
    assert a != generate_kv(20, 5, seed=4, key_format="letters6", value_format="digits4")
    for r in a:
        keys = [k for k, _ in r["ordered_kv_records"]]
        assert len(set(keys)) == 20 and all(len(k) == 6 and k.isalpha() for k in keys)
        assert [r["key"], r["value"]] in r["ordered_kv_records"]
    uuids = generate_kv(3, 1, seed=0)[0]
    assert all(len(k) == 36 and k[14] == "4" for k, _ in uuids["ordered_kv_records"])
    for index in range(20):
        s = kv_sample(a[0], index)
        assert s.prompt[slice(*s.spans[index])] == f'"{a[0]["key"]}": "{a[0]["value"]}"'


def test_passkey_and_two_fact_generators():
    s = passkey_sample(num_fillers=40, depth=0.5, seed=7)
    assert s == passkey_sample(num_fillers=40, depth=0.5, seed=7)
    key = s.answers[0]
    assert s.prompt.count(f"The pass key is {key}.") == 1 and s.prompt.endswith("The pass key is")
    assert s.prompt[: s.spans[0][0]].count(data.PASSKEY_FILLER) == 20
    assert passkey_sample(40, 0.0, seed=7).spans[0][0] < passkey_sample(40, 1.0, seed=7).spans[0][0]
    filler = [f"Filler sentence number {i}." for i in range(100)]
    t = two_fact_sample(filler, depth=0.8, seed=1)
    assert t == two_fact_sample(filler, depth=0.8, seed=1)
    place = t.answers[0]
    assert f"went to the {place}." in t.prompt and t.spans[0][0] < t.spans[1][0]
    with pytest.raises(ValueError, match="depth must be in"):
        passkey_sample(10, 1.5)


def test_text_windows_are_disjoint_and_seeded():
    tokens = list(range(1000))
    w = text_windows(tokens, 100, 4, seed=1)
    assert w == text_windows(tokens, 100, 4, seed=1) and all(len(x) == 100 for x in w)
    assert len({x[0] for x in w}) == 4 and all(x[0] % 100 == 0 for x in w)
    with pytest.raises(ValueError, match="room for 10 windows of 100 tokens, asked for 11"):
        text_windows(tokens, 100, 11)


def test_missing_and_corrupt_data_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing data file .*mdqa.*LPES_DATA_DIR.*data/README.md"):
        load_mdqa(data_dir=tmp_path)
    (tmp_path / "kv").mkdir()
    with gzip.open(tmp_path / data.KV_FILE, "wt") as f:
        f.write(json.dumps({"key": "a"}) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"corrupt JSON in .*kv-retrieval-75_keys.jsonl.gz, line 2"):
        load_kv(data_dir=tmp_path)
    (tmp_path / data.KV_FILE).write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="cannot read .* as gzipped JSON lines"):
        load_kv(data_dir=tmp_path)


# --- metrics ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prediction, answers, expected",
    [
        ("The Eiffel Tower.", ["Eiffel Tower"], 1.0),  # article and punctuation
        ("an apple a day", ["The Apple"], 1.0),
        ("Wilhelm Conrad Röntgen won it", ["Wilhelm Conrad Röntgen"], 1.0),  # unicode kept
        ("Wilhelm Conrad Rontgen", ["Wilhelm Conrad Röntgen"], 0.0),  # no accent folding in SQuAD
        ("1,000 people", ["1000"], 1.0),  # punctuation inside numbers is removed
        ("Paris", ["London", "paris"], 1.0),  # any of several golds
        ("Par is", ["Paris"], 0.0),
        ("", ["x"], 0.0),
        ("theatre", ["the"], 1.0),  # substring semantics of the original: "the" vanishes, "" is in anything
    ],
)
def test_best_subspan_em(prediction, answers, expected):
    assert best_subspan_em(prediction, answers) == expected


def test_mdqa_answer_is_cut_at_the_first_newline_like_the_original():
    assert mdqa_correct("Paris\nLondon", ["London"]) == 0.0
    assert mdqa_correct("  Paris  \nLondon", ["Paris"]) == 1.0
    assert mdqa_correct("\nParis", ["Paris"]) == 0.0  # a leading newline leaves an empty answer
    assert normalize_answer("  The  Cat's   hat! ") == "cats hat"


def test_the_length_check_judges_only_the_first_words_of_the_first_line():
    names = "Marie Curie, Pierre Curie, Irène Joliot-Curie, Ève Curie, Henri Becquerel"
    assert mdqa_correct(names, ["Henri Becquerel"]) == 1.0
    assert mdqa_correct_within(names, ["Henri Becquerel"], 9) == 0.0  # the 9th and 10th normalised words ("joliotcurie" is one)
    assert mdqa_correct_within(names, ["Henri Becquerel"], 10) == 1.0
    assert mdqa_correct_within("The Eiffel Tower.\nParis", ["Paris"], 10) == 0.0  # still the first line only
    assert mdqa_correct_within("the Eiffel Tower", ["Eiffel Tower"], 2) == 1.0  # articles go before counting
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match=f"words must be a whole number >= 1, got {bad!r}"):
            mdqa_correct_within("Paris", ["Paris"], bad)


def test_kv_passkey_perplexity():
    assert kv_correct(' "4821"', "4821") == 1.0 and kv_correct("ABC-def", "abc-DEF") == 1.0
    assert kv_correct("482", "4821") == 0.0
    assert passkey_correct(" 71432. Remember", "71432") == 1.0
    assert passkey_correct(" 714321", "71432") == 0.0 and passkey_correct("none", "1") == 0.0
    assert perplexity(np.log(7.0) * 10, 10) == pytest.approx(7.0)
    with pytest.raises(ValueError):
        perplexity(1.0, 0)


def test_u_shape_rho_per_sample():
    positions = [0.0, 0.0, 0.5, 0.5, 1.0, 1.0]
    assert u_shape_rho(positions, [1, 1, 0, 0, 1, 1]) == pytest.approx(100.0)  # U: middle worst
    assert u_shape_rho(positions, [0, 0, 1, 1, 0, 0]) == pytest.approx(-100.0)
    assert np.isnan(u_shape_rho(positions, [1, 1, 1, 1, 1, 1]))  # no variation: undefined, not 0
    assert 0 < u_shape_rho([0, 0.2, 0.5, 0.8, 1], [1, 1, 0, 0, 1]) < 100


def test_bootstrap_ci_and_accuracy_table():
    values = np.r_[np.ones(30), np.zeros(70)]
    mean, lo, hi = bootstrap_ci(values)
    assert mean == pytest.approx(0.3) and 0.2 < lo < 0.3 < hi < 0.4
    assert bootstrap_ci([1.0, 1.0]) == (1.0, 1.0, 1.0)
    df = pd.DataFrame({"position": [0, 0, 0, 9, 9], "correct": [1, 1, 0, 0, 0]})
    table = accuracy_table(df)
    assert table["n"].tolist() == [3, 2] and table["mean"].tolist() == pytest.approx([2 / 3, 0.0])
    assert (table["ci_low"] <= table["mean"]).all() and (table["mean"] <= table["ci_high"]).all()


def test_rank_agreement_uses_the_rank_correlations_own_variance():
    # Σd² = 56 over 15 candidates: ρ = 1 − 6·56 / (15·224) = 0.9; Fisher z with 1.06 / 12 (Pearson's
    # 1 / 12 would give [0.72, 0.97])
    got = rank_agreement(range(15), [4, 1, 0, 5, 2, 3, 8, 7, 6, 11, 10, 9, 14, 13, 12])
    assert got["rho"] == pytest.approx(0.9)
    assert (round(got["ci_low"], 3), round(got["ci_high"], 3)) == (0.711, 0.968)
    with pytest.raises(ValueError, match=r"one value per candidate each, got shapes \(15,\) and \(14,\)"):
        rank_agreement(range(15), range(14))
    # by hand: z = atanh(0.9) = 1.4722, half = 1.96 · sqrt(1.06 / 12) = 0.5825 → tanh(0.8897), tanh(2.0547)
    assert tuple(round(v, 3) for v in spearman_interval(0.9, 15)) == (0.711, 0.968)
    with pytest.raises(ValueError, match="needs n >= 4 items, got 3"):
        spearman_interval(0.5, 3)
