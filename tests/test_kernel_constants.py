"""The numbers the kernels and the Python side share live once, in ``kernels/constants.cuh``: every kernel includes it
(through ``common.cuh``) and ``gpt2enc_edu.layout`` reads it (``sources.kernel_constants``). What is left to check is
that no kernel file defines a name again, and that the Python side exposes what it reads."""

from __future__ import annotations

import re
from collections import defaultdict

from gpt2enc_edu import layout, rounding
from gpt2enc_edu.sources import kernel_constants, kernel_dir


def test_no_constant_is_defined_in_two_files():
    files_of = defaultdict(set)
    for path in sorted(kernel_dir().glob("*.cu*")):
        for name in re.findall(r"^\s*#\s*define\s+(\w+)", path.read_text(), re.M):
            files_of[name].add(path.name)
    twice = {name: sorted(files) for name, files in files_of.items() if len(files) > 1}
    assert twice == {}, f"#defined in more than one kernel file (move it to constants.cuh): {twice}"
    header = set(kernel_constants())
    assert {name for name, files in files_of.items() if files == {"constants.cuh"}} == header


def test_the_python_side_reads_the_header():
    python_side = {**vars(layout), "NOISE_STREAM_DWTE": rounding.NOISE_STREAM_DWTE,
                   "NOISE_STREAM_DWPE": rounding.NOISE_STREAM_DWPE}
    for name, value in kernel_constants().items():
        if name != "SMALL_POS_MASK":  # the kernels' mask of SMALL_POS_BITS; the mirrors build their own
            assert python_side[name] == value, name
