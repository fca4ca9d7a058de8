"""The rules a learner's CUDA source must follow before it is compiled, and its compiler messages.

All of this is plain text work (tested without a GPU):

* ``code_only`` drops comments (after joining lines that end in a backslash, as the preprocessor does), so
  the marker line and a comment that names ``__global__`` decide nothing: a source with no code left is an
  open exercise, and one whose *code* holds ``__global__`` is a whole file (else a body for the gap);
* ``prepare`` refuses what would let the package's code pass for the learner's: an ``#include`` of anything but
  ``common.cuh``, any other preprocessor directive (``#define``/``#undef`` of the kernel's name, ``#line``,
  ``#pragma push_macro``, ...; ``#pragma unroll`` is fine, and a whole file may keep the skeleton's own
  directive lines unchanged), ``_Pragma`` and digraphs, a body whose braces close the kernel, a whole file
  that does not define the exercise's kernel exactly once, and a file that is one of the package's kernel
  files (equal but for comments and whitespace);
* ``map_log`` rewrites NVRTC's ``file(LINE): error`` lines to the learner's own line numbers;
* ``listing`` wraps a kernel file's text (``loader.kernel_source``) in a collapsed HTML block for a notebook.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

from ..loader import kernel_dir
from .pysource import SourceRejected
from .skeletons import KERNEL_EXERCISES, _body_span, gap_offset, skeleton

_TOKENS = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_DIRECTIVE_OK = re.compile(r'#\s*(include\s*["<]common\.cuh[">]|pragma\s+unroll(\s*\(?\s*\w+\s*\)?)?)\s*$')


def code_only(text: str) -> str:
    """``text`` without comments (each comment becomes a space; line breaks inside one are kept)."""
    text = text.replace("\\\r\n", "").replace("\\\n", "")

    def blank(match):
        token = match.group(0)
        return token if token[0] in "\"'" else " " + "\n" * token.count("\n")

    return _TOKENS.sub(blank, text)


def _without_literals(code: str) -> str:
    return re.sub(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', '""', code)


def is_open(text, exercise: str | None = None) -> bool:
    """True for ``None``, for a body with nothing but comments and whitespace (the untouched gap), and for a
    whole file whose ``exercise`` kernel has such a body (the skeleton itself)."""
    if text is None or not code_only(text).strip():
        return True
    if exercise in KERNEL_EXERCISES and is_whole_file(text):
        code = code_only(text)
        try:
            start, end = _body_span(code, KERNEL_EXERCISES[exercise].kernel)
        except (ValueError, IndexError):
            return False
        return not code[start + 1 : end].strip()
    return False


def is_whole_file(text: str) -> bool:
    return re.search(r"\b__global__\b", code_only(text)) is not None


def _normal(text: str) -> str:
    return " ".join(code_only(text).split())


def _directives(code: str) -> list[str]:
    return [" ".join(line.split()) for line in code.splitlines() if line.strip().startswith("#")]


def _kernel_definitions(code: str, kernel: str) -> int:
    pattern = rf"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?{re.escape(kernel)}\s*\("
    return len(re.findall(pattern, code))


@dataclass(frozen=True)
class Prepared:
    """A source that passed the rules: the whole file to compile, and where the learner's line 1 sits in it."""

    source: str
    first_line: int  #: line of ``source`` that is line 1 of the learner's text
    whole_file: bool


def prepare(exercise: str, text: str) -> Prepared:
    """The whole source to compile for ``text``, or ``SourceRejected`` naming the rule it breaks."""
    spec = KERNEL_EXERCISES[exercise]
    code = code_only(text)
    whole = is_whole_file(text)
    bare = _without_literals(code)
    if "_Pragma" in bare or "%:" in bare or "??=" in bare:
        raise SourceRejected("no _Pragma, digraph (%:) or trigraph (??=): write plain CUDA")
    allowed = set(_directives(code_only(skeleton(exercise)))) if whole else set()
    for line in _directives(code):
        if not _DIRECTIVE_OK.match(line) and line not in allowed:
            raise SourceRejected(f"`{line}`: your CUDA may include only common.cuh and use #pragma unroll "
                                 "(a whole file may also keep the skeleton's own directives unchanged); macros, "
                                 "#line and other includes could swap the package's code in for yours")
    if whole:
        count = _kernel_definitions(bare, spec.kernel)
        if count != 1:
            raise SourceRejected(f"a whole file must define {spec.kernel} exactly once (found {count})")
        normal = _normal(text)
        for path in sorted(kernel_dir().glob("*.cu*")):
            if normal == _normal(path.read_text()):
                raise SourceRejected(f"this is the package's own kernels/{path.name}, not your kernel")
        return Prepared(text, 1, True)
    depth = 0
    for char in bare:
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth < 0:
            raise SourceRejected("your body closes the kernel's brace: write only the body, with balanced braces")
    if depth:
        raise SourceRejected(f"your body leaves {depth} brace(s) open")
    if _kernel_definitions(bare, spec.kernel) or re.search(rf"\b{re.escape(spec.kernel)}\b", bare):
        raise SourceRejected(f"the body must not name {spec.kernel} itself")
    offset, source = gap_offset(exercise, text)
    return Prepared(source, offset + 1, False)


_LOG_LINE = re.compile(r"^[^\s(]*\((\d+)\): ", re.M)


def map_log(log: str, prepared: Prepared, learner_lines: int) -> str:
    """NVRTC's log with each ``file(LINE): `` turned into ``your line N: `` (or ``skeleton line N: ``)."""
    def rename(match):
        line = int(match.group(1))
        own = line - prepared.first_line + 1
        if 1 <= own <= learner_lines:
            return f"your line {own}: "
        return f"skeleton line {line}: "

    return _LOG_LINE.sub(rename, log)


def fill(exercise: str, body: str) -> str:
    """The whole source: ``body`` in the gap of ``skeleton(exercise)``. A whole file (with ``__global__`` in its
    code, not only in a comment) is returned as it is."""
    if is_whole_file(body):
        return body
    return gap_offset(exercise, body)[1]


def listing(source: str, summary: str, language: str = "cuda") -> str:
    """HTML that shows ``source`` (a kernel file's text, as ``loader.kernel_source`` returns it) collapsed under the
    line ``summary``, opened by a click: ``display(HTML(listing(kernel_source("x.cu"), "kernels/x.cu")))``."""
    return (f"<details><summary>{html.escape(summary)}</summary>\n"
            f'<pre><code class="language-{html.escape(language)}">{html.escape(source)}</code></pre>\n</details>')
