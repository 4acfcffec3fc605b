"""Tasks as prompts: multi-document QA, key-value retrieval, passkey, two-fact QA, long text.

Real data is read from the data directory (``data_dir=``, else ``$LPES_DATA_DIR``, else the
repository's ``data/``, which holds the files with their checksums and licences: ``data/README.md``);
synthetic tasks are generated from a seed. Prompts follow the lost-in-the-middle templates character
for character.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import string
import uuid
from dataclasses import dataclass, field
from pathlib import Path

MDQA_FILE = "mdqa/nq-open-20_total_documents_gold_at_0.jsonl.gz"
MDQA_RECORDS = 441  # the questions with real retrieved distractors in MDQA_FILE
ORACLE_FILE = "mdqa/nq-open-oracle.jsonl.gz"  # every NQ-open question with its gold passage (general text for training)
KV_FILES = {75: "kv/kv-retrieval-75_keys.jsonl.gz", 140: "kv/kv-retrieval-140_keys.jsonl.gz"}  # pairs -> file
KV_FILE = KV_FILES[75]
KV_RECORDS = 500  # records in each KV file
TEXT_FILE = "text/kjv.txt.gz"

QA_INSTRUCTION = (
    "Write a high-quality answer for the given question using only the provided search results "
    "(some of which might be irrelevant)."
)
KV_INSTRUCTION = "Extract the value corresponding to the specified key in the JSON object below."


@dataclass(frozen=True)
class Sample:
    """One prompt with its gold answers. ``position`` is the gold item's index in the context and
    ``spans`` the character spans of the context items (documents or KV pairs), in order."""

    task: str
    sample_id: int
    position: int
    num_items: int
    prompt: str
    answers: tuple[str, ...]
    spans: tuple[tuple[int, int], ...] = field(default=(), repr=False)


def data_dir(path: str | Path | None = None) -> Path:
    if path is not None:
        return Path(path)
    if "LPES_DATA_DIR" in os.environ:
        return Path(os.environ["LPES_DATA_DIR"])
    return Path(__file__).resolve().parents[2] / "data"


def _data_file(relative: str, path: str | Path | None) -> Path:
    file = data_dir(path) / relative
    if not file.is_file():
        raise FileNotFoundError(
            f"missing data file {file}; put it there, set LPES_DATA_DIR or pass data_dir= "
            "(data/README.md says where to obtain the files)"
        )
    return file


def read_jsonl_gz(file: Path, limit: int | None = None) -> list[dict]:
    """Records of a gzipped JSON-lines file; a clear error naming the file and line if corrupt."""
    records = []
    try:
        with gzip.open(file, "rt", encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if limit is not None and len(records) >= limit:
                    break
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise ValueError(f"corrupt JSON in {file}, line {line_no}: {err.msg}") from None
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read {file} as gzipped JSON lines: {err}") from None
    if not records:
        raise ValueError(f"{file} holds no records (an empty file?)")
    return records


# --- multi-document QA --------------------------------------------------------------------------


def load_mdqa(limit: int | None = None, data_dir: str | Path | None = None) -> list[dict]:
    """The MDQA_RECORDS (441) NQ-open questions with the gold document first and 19 retrieved distractors."""
    records = read_jsonl_gz(_data_file(MDQA_FILE, data_dir), limit)
    for i, r in enumerate(records):
        if not {"question", "answers", "ctxs"} <= r.keys() or not r["ctxs"] or not r["ctxs"][0].get("isgold"):
            raise ValueError(f"MDQA record {i} does not follow the schema (question, answers, ctxs with the gold first)")
    return records


def general_text(tokenizer, sequences: int, tokens: int, data_dir: str | Path | None = None) -> list[list[int]]:
    """``sequences`` token sequences of ``tokens`` tokens each for training a router on general text (MoICE
    as published trains on instruction data, never on the evaluated task): NQ-open passages with their
    question and first answer, in the oracle file's order, packed one after another. Every question among
    the 441 MDQA-20 records is left out, so no test question or passage is trained on."""
    held_out = {r["question"] for r in load_mdqa(data_dir=data_dir)}
    pool = [r for r in read_jsonl_gz(_data_file(ORACLE_FILE, data_dir)) if r["question"] not in held_out]
    ids, out = [], []
    for r in pool:
        doc = r["ctxs"][0]
        ids += tokenizer(f"{doc['title']}\n{doc['text']}\nQuestion: {r['question']}\nAnswer: {r['answers'][0]}\n\n",
                         add_special_tokens=False)["input_ids"]
        while len(ids) >= tokens and len(out) < sequences:
            out.append(ids[:tokens])
            ids = ids[tokens:]
        if len(out) == sequences:
            return out
    raise ValueError(f"the {len(pool)} oracle records not among the MDQA-20 questions make {len(out)} sequences of "
                     f"{tokens} tokens, not the {sequences} asked for")


def format_document(index: int, title: str, text: str) -> str:
    return f"Document [{index}](Title: {title}) {text}"


def qa_prompt(question: str, documents: list[dict]) -> tuple[str, tuple[tuple[int, int], ...]]:
    """The original QA prompt and the character span of each formatted document."""
    head = f"{QA_INSTRUCTION}\n\n"
    parts, spans, offset = [], [], len(head)
    for i, doc in enumerate(documents):
        text = format_document(i + 1, doc["title"], doc["text"])
        parts.append(text)
        spans.append((offset, offset + len(text)))
        offset += len(text) + 1
    return f"{head}{chr(10).join(parts)}\n\nQuestion: {question}\nAnswer:", tuple(spans)


def mdqa_sample(record: dict, gold_index: int, num_docs: int = 10, sample_id: int = 0) -> Sample:
    """Gold document moved to ``gold_index`` among the first ``num_docs - 1`` distractors (kept in
    retrieval order), as the lost-in-the-middle setting does."""
    most = len(record["ctxs"])
    if isinstance(num_docs, bool) or not isinstance(num_docs, int) or not 2 <= num_docs <= most:
        raise ValueError(f"num_docs must be an integer in [2, {most}] (the record's gold document and its "
                         f"{most - 1} distractors), got {num_docs!r}")
    if isinstance(gold_index, bool) or not isinstance(gold_index, int):
        raise ValueError(f"gold_index must be an integer in [0, {num_docs - 1}], got {gold_index!r}")
    distractors = record["ctxs"][1:num_docs]
    if len(distractors) != num_docs - 1:
        raise ValueError(f"num_docs={num_docs} needs {num_docs - 1} distractors, the record has {len(record['ctxs']) - 1}")
    if not 0 <= gold_index < num_docs:
        raise ValueError(f"gold_index {gold_index} is outside [0, {num_docs - 1}]")
    docs = distractors[:gold_index] + [record["ctxs"][0]] + distractors[gold_index:]
    prompt, spans = qa_prompt(record["question"], docs)
    return Sample("mdqa", sample_id, gold_index, num_docs, prompt, tuple(record["answers"]), spans)


CLOSED_BOOK_INSTRUCTION = "Write a high-quality answer for the given question."


def closed_book_sample(record: dict, sample_id: int = 0) -> Sample:
    """The question without documents (lost-in-the-middle's closed-book prompt): what the model knows
    anyway. ``num_items`` 0."""
    prompt = f"{CLOSED_BOOK_INSTRUCTION}\n\nQuestion: {record['question']}\nAnswer:"
    return Sample("mdqa", sample_id, 0, 0, prompt, tuple(record["answers"]), ())


def oracle_sample(record: dict, sample_id: int = 0) -> Sample:
    """The question with its gold document only (the oracle setting). ``num_items`` 1."""
    prompt, spans = qa_prompt(record["question"], [record["ctxs"][0]])
    return Sample("mdqa", sample_id, 0, 1, prompt, tuple(record["answers"]), spans)


# --- key-value retrieval ------------------------------------------------------------------------


def kv_prompt(pairs: list[tuple[str, str]], key: str) -> tuple[str, tuple[tuple[int, int], ...]]:
    """The original KV prompt (JSON one pair a line) and the character span of each pair."""
    if len(pairs) < 1:
        raise ValueError(f"kv_prompt needs at least one (key, value) pair, got {pairs!r}")
    if key not in {k for k, _ in pairs}:
        raise ValueError(f"the key {key!r} is not among the prompt's {len(pairs)} keys")
    head = f"{KV_INSTRUCTION}\n\nJSON data:\n"
    body, spans = "", []
    for i, (k, v) in enumerate(pairs):
        start = len(head) + len(body) + 1  # after "{" or " "
        pair = f'"{k}": "{v}"'
        body += ("{" if i == 0 else " ") + pair + (",\n" if i != len(pairs) - 1 else "}")
        spans.append((start, start + len(pair)))
    return f'{head}{body}\n\nKey: "{key}"\nCorresponding value:', tuple(spans)


def load_kv(limit: int | None = None, data_dir: str | Path | None = None, pairs: int = 75) -> list[dict]:
    """The original UUID records of ``pairs`` pairs (75 or 140): ``{"ordered_kv_records", "key", "value"}``."""
    if pairs not in KV_FILES:
        raise ValueError(f"the original KV files hold {sorted(KV_FILES)} pairs per record, not pairs={pairs!r}")
    records = read_jsonl_gz(_data_file(KV_FILES[pairs], data_dir), limit)
    wrong = next((i for i, r in enumerate(records) if len(r["ordered_kv_records"]) != pairs), None)
    if wrong is not None:
        raise ValueError(f"KV record {wrong} of {KV_FILES[pairs]} has {len(records[wrong]['ordered_kv_records'])} pairs, "
                         f"not {pairs}")
    return records


KV_FORMATS = {
    "uuid": lambda rng: str(uuid.UUID(int=rng.getrandbits(128), version=4)),
    "letters6": lambda rng: "".join(rng.choices(string.ascii_lowercase, k=6)),
    "digits4": lambda rng: f"{rng.randrange(1000, 10000)}",
}
KV_KEY_SPACE = {"uuid": 2**122, "letters6": 26**6, "digits4": 9000}


def generate_kv(num_pairs: int, n: int, seed: int = 0, key_format: str = "uuid", value_format: str = "uuid") -> list[dict]:
    """``n`` records of ``num_pairs`` distinct keys (the paper: UUIDs; small models: letters6/digits4)."""
    for fmt in (key_format, value_format):
        if fmt not in KV_FORMATS:
            raise ValueError(f"unknown KV format {fmt!r}; choose one of {sorted(KV_FORMATS)}")
    if isinstance(num_pairs, bool) or not isinstance(num_pairs, int) or num_pairs < 2:
        raise ValueError(f"num_pairs must be an integer >= 2, got {num_pairs!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if num_pairs > KV_KEY_SPACE[key_format] // 2:  # distinct keys must stay easy to draw
        raise ValueError(f"num_pairs={num_pairs} is too many distinct {key_format!r} keys; the allowed range is "
                         f"[2, {KV_KEY_SPACE[key_format] // 2}]")
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        keys: dict[str, str] = {}
        while len(keys) < num_pairs:
            keys.setdefault(KV_FORMATS[key_format](rng), KV_FORMATS[value_format](rng))
        pairs = list(keys.items())
        key, value = pairs[rng.randrange(num_pairs)]
        records.append({"ordered_kv_records": [list(p) for p in pairs], "key": key, "value": value})
    return records


def kv_sample(record: dict, gold_index: int, sample_id: int = 0) -> Sample:
    """The gold pair removed and reinserted at ``gold_index``."""
    pairs = [tuple(p) for p in record["ordered_kv_records"]]
    gold = (record["key"], record["value"])
    if gold not in pairs:
        raise ValueError(f"record {sample_id}: the gold pair {gold} is not among its pairs")
    if not 0 <= gold_index < len(pairs):
        raise ValueError(f"gold_index {gold_index} is outside [0, {len(pairs) - 1}]")
    pairs.remove(gold)
    pairs.insert(gold_index, gold)
    prompt, spans = kv_prompt(pairs, record["key"])
    return Sample("kv", sample_id, gold_index, len(pairs), prompt, (record["value"],), spans)


# --- passkey and two-fact QA ----------------------------------------------------------------------

PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def passkey_sample(num_fillers: int, depth: float, seed: int = 0, sample_id: int = 0) -> Sample:
    """The LongLoRA / landmark-attention passkey prompt with the needle at relative ``depth``."""
    if isinstance(num_fillers, bool) or not isinstance(num_fillers, int) or num_fillers < 0:
        raise ValueError(f"num_fillers must be an integer >= 0, got {num_fillers!r}")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    key = random.Random(seed).randrange(10000, 100000)
    before = round(num_fillers * depth)
    head = (
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
        "I will quiz you about the important information there."
    )
    needle = f"The pass key is {key}. Remember it. {key} is the pass key."
    parts = [head, *[PASSKEY_FILLER] * before, needle, *[PASSKEY_FILLER] * (num_fillers - before)]
    prompt = " ".join(parts) + " What is the pass key? The pass key is"
    start = prompt.index(needle)
    return Sample("passkey", sample_id, before, num_fillers + 1, prompt, (str(key),), ((start, start + len(needle)),))


_NAMES = ["Mary", "John", "Daniel", "Sandra", "Fred", "Bill", "Julie", "Jeff"]
_OBJECTS = ["apple", "football", "milk", "box", "key", "book"]
_PLACES = ["kitchen", "garden", "hallway", "bathroom", "office", "bedroom"]


def two_fact_sample(filler_sentences: list[str], depth: float, seed: int = 0, sample_id: int = 0,
                    gap: int | None = None) -> Sample:
    """A BABILong-qa2-style question: "X picked up the O." then "X went to the P." hidden in filler;
    the answer (where the object is) needs both facts.

    ``gap=None`` is the first layout: fact 1 after a fraction depth/2 of the filler, fact 2 after a
    fraction depth, so the facts' distance grows with the depth. With ``gap`` (filler sentences
    between the facts) the two facts move together as one block whose start is at ``depth`` of the
    remaining filler: only the position varies."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    n = len(filler_sentences)
    if gap is not None and (isinstance(gap, bool) or not isinstance(gap, int) or not 0 <= gap <= n):
        raise ValueError(f"gap must be None or an integer in [0, {n}] (the filler has {n} sentences), got {gap!r}")
    rng = random.Random(seed)
    name, obj, place = rng.choice(_NAMES), rng.choice(_OBJECTS), rng.choice(_PLACES)
    facts = [f"{name} picked up the {obj}.", f"{name} went to the {place}."]
    if gap is None:
        cut1, cut2 = round(n * depth * 0.5), round(n * depth)
    else:
        cut1 = round((n - gap) * depth)
        cut2 = cut1 + gap
    sentences = filler_sentences[:cut1] + [facts[0]] + filler_sentences[cut1:cut2] + [facts[1]] + filler_sentences[cut2:]
    context = " ".join(sentences)
    prompt = f"{context}\n\nQuestion: Where is the {obj}?\nAnswer: The {obj} is in the"
    spans = tuple((prompt.index(f), prompt.index(f) + len(f)) for f in facts)
    return Sample("two_fact", sample_id, cut2, n + 2, prompt, (place,), spans)


# --- long text ------------------------------------------------------------------------------------


def long_text(data_dir: str | Path | None = None) -> str:
    """The long public-domain book text (King James Bible), ~4.1 M characters."""
    file = _data_file(TEXT_FILE, data_dir)
    try:
        with gzip.open(file, "rt", encoding="utf-8") as f:
            return f.read()
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read {file} as gzipped text: {err}") from None


def text_windows(token_ids: list[int], length: int, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` non-overlapping windows of ``length`` tokens at seeded random offsets."""
    for name, value in (("length", length), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"text_windows: {name} must be an integer >= 1, got {value!r}")
    slots = len(token_ids) // length
    if slots < n:
        raise ValueError(f"the text has room for {slots} windows of {length} tokens, asked for {n}")
    starts = sorted(random.Random(seed).sample(range(slots), n))
    return [token_ids[s * length : (s + 1) * length] for s in starts]


def book_sentences(text: str) -> list[str]:
    """The book text as sentences (longer than 20 characters); split once, then sample from it."""
    return [s.strip() + "." for s in text.replace("\n", " ").split(".") if len(s.strip()) > 20]


def filler_sentences(sentences: list[str], n: int, seed: int = 0) -> list[str]:
    """``n`` consecutive sentences from a seeded start (filler for two-fact QA)."""
    start = random.Random(seed).randrange(len(sentences) - n)
    return sentences[start : start + n]


def positions_for(num_items: int, count: int = 3) -> list[int]:
    """``count`` evenly spread gold positions from first to last (3 -> begin / middle / end)."""
    if count == 1:
        return [0]
    return sorted({round(i * (num_items - 1) / (count - 1)) for i in range(count)})
