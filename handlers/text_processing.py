"""Text clean-up and tokenisation used by the text handlers, without torchtext.

``basic_english`` and ``ngrams_iterator`` reproduce torchtext's functions of those names; the
clean-up steps are those of TorchServe's ``TextHandler``. The contraction table is Lantern's own
(common English contractions), applied on word boundaries.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Iterator, Sequence

CONTRACTIONS: dict[str, str] = {
    "ain't": "is not", "aren't": "are not", "can't": "cannot", "can't've": "cannot have",
    "could've": "could have", "couldn't": "could not", "didn't": "did not",
    "doesn't": "does not", "don't": "do not", "hadn't": "had not", "hasn't": "has not",
    "haven't": "have not", "he'd": "he would", "he'll": "he will", "he's": "he is",
    "how'd": "how did", "how'll": "how will", "how's": "how is", "i'd": "i would",
    "i'll": "i will", "i'm": "i am", "i've": "i have", "isn't": "is not", "it'd": "it would",
    "it'll": "it will", "it's": "it is", "let's": "let us", "ma'am": "madam",
    "might've": "might have", "mightn't": "might not", "must've": "must have",
    "mustn't": "must not", "needn't": "need not", "o'clock": "of the clock",
    "shan't": "shall not", "she'd": "she would", "she'll": "she will", "she's": "she is",
    "should've": "should have", "shouldn't": "should not", "that'd": "that would",
    "that's": "that is", "there'd": "there would", "there's": "there is",
    "they'd": "they would", "they'll": "they will", "they're": "they are",
    "they've": "they have", "wasn't": "was not", "we'd": "we would", "we'll": "we will",
    "we're": "we are", "we've": "we have", "weren't": "were not", "what'll": "what will",
    "what're": "what are", "what's": "what is", "what've": "what have", "when's": "when is",
    "where'd": "where did", "where's": "where is", "who'll": "who will", "who's": "who is",
    "who've": "who have", "why's": "why is", "won't": "will not", "would've": "would have",
    "wouldn't": "would not", "y'all": "you all", "you'd": "you would", "you'll": "you will",
    "you're": "you are", "you've": "you have",
}  # fmt: skip

# Longest first, so "can't've" wins over "can't".
_CONTRACTIONS_RE = re.compile(
    r"\b(" + "|".join(re.escape(k) for k in sorted(CONTRACTIONS, key=len, reverse=True)) + r")\b",
    flags=re.IGNORECASE,
)
_HTML_RE = re.compile(r"<.*?>|&([a-z0-9]+|#[0-9]{1,6}|#x[0-9a-f]{1,6});")
_PUNCTUATION = str.maketrans("", "", string.punctuation)

# torchtext's basic_english normaliser: (pattern, replacement), applied in order.
_BASIC_ENGLISH = [
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (r"\'", " '  "),
        (r"\"", ""),
        (r"\.", " . "),
        (r"<br \/>", " "),
        (r",", " , "),
        (r"\(", " ( "),
        (r"\)", " ) "),
        (r"\!", " ! "),
        (r"\?", " ? "),
        (r"\;", " "),
        (r"\:", " "),
        (r"\s+", " "),
    )
]


def remove_html_tags(text: str) -> str:
    return _HTML_RE.sub("", text)


def expand_contractions(text: str) -> str:
    """``don't`` -> ``do not`` (keeping the first letter's case), then drop other apostrophes."""

    def expand(match: re.Match) -> str:
        word = match.group(0)
        expanded = CONTRACTIONS[word.lower()]
        return word[0] + expanded[1:]

    return _CONTRACTIONS_RE.sub(expand, text).replace("'", "")


def remove_accented_characters(text: str) -> str:
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")


def remove_punctuation(text: str) -> str:
    return text.translate(_PUNCTUATION)


def basic_english(line: str) -> list[str]:
    """torchtext's ``get_tokenizer("basic_english")``: lowercase, split off punctuation."""
    line = line.lower()
    for pattern, replacement in _BASIC_ENGLISH:
        line = pattern.sub(replacement, line)
    return line.split()


def ngrams_iterator(tokens: Sequence[str], ngrams: int) -> Iterator[str]:
    """The tokens, then every 2..``ngrams``-gram joined by spaces (torchtext's order)."""
    yield from tokens
    for n in range(2, ngrams + 1):
        for gram in zip(*(tokens[i:] for i in range(n)), strict=False):
            yield " ".join(gram)
