"""docs/performance.md cannot drift from the bench: its tables are what ``gpt2enc_edu.bench.perfdoc`` writes from the
committed run (docs/bench/results.csv, meta.json), and every measured number in its prose outside those tables is an
older measurement quoted from docs/experiments.md, in a paragraph that names its date and links there. The links
between the performance docs resolve."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from gpt2enc_edu.bench import perfdoc
from gpt2enc_edu.bench.report import load_results

DOCS = Path(__file__).resolve().parent.parent / "docs"
PERFORMANCE = DOCS / "performance.md"
EXPERIMENTS = DOCS / "experiments.md"
#: A measured quantity: a number with a unit of time, a rate, a share or a ratio.
MEASURED = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?(µs|us|ms|%|GB/s|TB/s|×)(?!\w)")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
BLOCK = re.compile(r"<!-- perf:([a-z]+):start -->.*?<!-- perf:\1:end -->", re.S)


@pytest.fixture(scope="module")
def committed():
    return load_results(DOCS / "bench")


def _prose(text: str) -> str:
    """The doc without its generated blocks."""
    return BLOCK.sub("", text)


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


def test_performance_blocks_are_what_the_committed_bench_gives(committed):
    rows, meta = committed
    rendered = perfdoc.blocks(rows, meta)
    text = PERFORMANCE.read_text()
    stale = perfdoc.stale_blocks(text, rendered)
    assert not stale, f"docs/performance.md: stale blocks {stale}; run `python -m gpt2enc_edu.bench.perfdoc`"
    assert set(re.findall(r"<!-- perf:([a-z]+):start -->", text)) == set(rendered), "a block without a renderer"


def test_a_block_shows_the_rows_it_is_given(committed):
    """The renderer reads the rows: a changed median and floor share show in the backward block, in place."""
    rows, meta = copy.deepcopy(committed)
    by_kind = {r["ids"]: r for r in rows if (r["case"], r["B"]) == ("chunked_gpu", 64)}
    row, others = by_kind["uniform"], [by_kind["zipf"], by_kind["real"]]
    row["median_us"], row["pct_of_floor"] = 123.456, 41.6
    block = perfdoc.blocks(rows, meta)["backward"]
    line = next(ln for ln in block.splitlines() if ln.startswith("| chunked, table built in"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    expected = ("123.5 / " + " / ".join(perfdoc.format_us(r["median_us"]) for r in others)
                + " (42 / " + " / ".join(f"{r['pct_of_floor']:.0f}" for r in others) + "%)")
    assert cells[-1] == expected


def test_the_two_reads_bound_is_the_floor_over_the_floor_and_one_more_read_of_dout(committed):
    """A chunked call of floor 10 µs whose minimal bytes are dout twice over: one more read of dout costs 5 µs at
    the floor's rate, so a call that reads dout twice reaches at most 10 / 15 of the floor."""
    rows, meta = copy.deepcopy(committed)
    row = next(r for r in rows if (r["case"], r["ids"], r["B"]) == ("chunked_gpu", "uniform", 64))
    dout_bytes = row["B"] * row["T"] * row["C"] * {"bf16": 2, "fp32": 4}[row["dtype"]]
    row["floor_us"], row["minimal_bytes"] = 10.0, 2 * dout_bytes
    block = perfdoc.blocks(rows, meta)["backward"]
    line = next(ln for ln in block.splitlines() if ln.startswith("| the most of the floor a call that reads"))
    assert [c.strip() for c in line.strip("|").split("|")][-1].startswith("67 / ")


def test_update_text_rewrites_only_between_the_markers():
    start, end = perfdoc.markers("forward")
    text = f"before\n{start}\nold table\n{end}\nafter\n"
    new = perfdoc.update_text(text, {"forward": "| new |"})
    assert new == f"before\n{start}\n\n| new |\n\n{end}\nafter\n"
    assert perfdoc.stale_blocks(new, {"forward": "| new |"}) == []
    assert perfdoc.stale_blocks(text, {"forward": "| new |"}) == ["forward"]
    assert perfdoc.stale_blocks("no markers", {"forward": "| new |"}) == ["forward"]
    with pytest.raises(ValueError, match="marker"):
        perfdoc.update_text("no markers", {"forward": "| new |"})


def test_performance_prose_quotes_only_dated_experiments():
    """Outside the generated blocks, a measured number appears only in a paragraph (or list item) that names its date
    and links to experiments.md, and that number is written there too (where it cannot change, being dated)."""
    experiments = EXPERIMENTS.read_text()
    problems = []
    paragraphs = [item for block in re.split(r"\n\s*\n", _prose(PERFORMANCE.read_text()))
                  for item in re.split(r"\n(?=- )", block)]  # a list's items one by one
    for paragraph in paragraphs:
        found = [m.group(0) for m in MEASURED.finditer(paragraph)]
        if not found:
            continue
        if not DATE.search(paragraph) or "experiments.md" not in paragraph:
            problems.append(f"numbers {found} without a date and a link to experiments.md: {paragraph[:80]!r}")
        problems += [f"{m.group(0)!r}: {m.group(1)} is not in experiments.md: {paragraph[:80]!r}"
                     for m in MEASURED.finditer(paragraph)
                     if not re.search(rf"(?<![\d.]){re.escape(m.group(1))}(?![\d.]\d|\d)", experiments)]
    assert not problems, "\n".join(problems)


def test_performance_stays_short():
    assert len(PERFORMANCE.read_text().splitlines()) <= 400


@pytest.mark.parametrize("doc", ["performance.md", "experiments.md", "verification.md", "benchmarks.md"])
def test_links_between_the_performance_docs_resolve(doc):
    text = (DOCS / doc).read_text()
    broken = []
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path = (DOCS / doc).parent / target if target else DOCS / doc
        if not path.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path.read_text()):
            broken.append(f"{target}#{anchor}")
    assert not broken, f"docs/{doc}: broken links {broken}"
