"""Sources as a reader can look them up: an English title, never a tracker number, a file
hash or text a page without a CJK font would draw as boxes.

Suites already recorded carry what they carried (a seed article's file name, "issue N goal",
a section heading in Chinese); the mapping happens here, at render time.
"""

from __future__ import annotations

import re

# The seed articles, by the file name a suite cites, with an English title for each.
SEED_TITLES = {
    "000_7334e9e5ff8d2acf.txt": "\"Transformers and attention, part 13: Q/K/V, Bahdanau's "
                                "attention as one formula\"",
    "002_84e81903a5872180.txt": "\"What Q, K and V are\" (From Bit to AGI, chapter 5)",
    "003_5b56d55fa636903b.txt": "\"What QKV in attention is: principles and engineering "
                                "practice\"",
}
# Section headings the suites quote in Chinese, in English.
PHRASES = {
    "代价：精度损失": "the price: lost accuracy",
    "KV Cache 设置为半精度 fp16/bf16": "KV cache in half precision, fp16/bf16",
}
TRACKER = re.compile(r"\bissue\s+\d+\s+goal\b", re.I)
SEED_FILE = re.compile(r"\b\d{3}_[0-9a-f]{16}\.txt\b")
CJK = re.compile(r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef]+")


def cite(source) -> str:
    """``source`` with seed file names as English titles, "issue N goal" as "attnbench
    goal", and any other CJK text dropped."""
    text = "" if source is None else str(source)
    for phrase, english in PHRASES.items():
        text = text.replace(phrase, english)
    text = TRACKER.sub("attnbench goal", text)
    text = SEED_FILE.sub(lambda m: SEED_TITLES.get(m.group(0), "a seed article"), text)
    text = CJK.sub(" ", text)
    text = re.sub(r"\(\s*[:：,;]?\s*\)", "", text)  # a parenthesis left empty
    return re.sub(r"\s+", " ", text).strip()


def cited(claim: dict) -> dict:
    """A claim with its source cited by title."""
    return claim | {"source": cite(claim["source"])} if claim.get("source") else claim
