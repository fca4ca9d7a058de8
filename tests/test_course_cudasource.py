"""The rules on a learner's CUDA source are plain text work: checked here without a GPU."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from gpt2enc_edu.course import cudasource, skeletons
from gpt2enc_edu.course.pysource import SourceRejected
from gpt2enc_edu.loader import kernel_dir, kernel_source

CUDA_SOLUTIONS = Path(__file__).resolve().parent.parent / "solutions" / "cuda"
EXERCISES = sorted(skeletons.KERNEL_EXERCISES)


@pytest.mark.parametrize("exercise", EXERCISES)
def test_the_solutions_pass_the_rules_as_bodies_and_as_whole_files(exercise):
    body = (CUDA_SOLUTIONS / f"{exercise}.cu").read_text()
    prepared = cudasource.prepare(exercise, body)
    assert not prepared.whole_file and body.strip() in prepared.source
    whole = cudasource.fill(exercise, body)
    assert cudasource.prepare(exercise, whole).whole_file


def test_the_marker_is_a_comment_and_never_a_trap():
    body = f"\n    {skeletons.GAP_MARK}\n    int idx = 0;\n"
    assert cudasource.is_open(f"\n    {skeletons.GAP_MARK}\n    // still thinking\n    /* about it */\n")
    assert not cudasource.is_open(body)
    assert cudasource.prepare("forward", body).source.count(skeletons.GAP_MARK) == 1


def test_a_comment_naming_global_does_not_make_a_whole_file():
    body = "    // the __global__ function gets one thread per pack\n" + (CUDA_SOLUTIONS / "forward.cu").read_text()
    assert not cudasource.is_whole_file(body)
    assert not cudasource.prepare("forward", body).whole_file
    assert cudasource.is_whole_file('/* a */ extern "C" __global__ void k() {}')


@pytest.mark.parametrize("exercise", EXERCISES)
def test_the_skeleton_itself_is_an_open_exercise(exercise):
    assert cudasource.is_open(skeletons.skeleton(exercise), exercise)
    assert not cudasource.is_open(cudasource.fill(exercise, (CUDA_SOLUTIONS / f"{exercise}.cu").read_text()), exercise)


FORWARD = "encoder_forward_v2_kernel"
CHEATS = [
    pytest.param(f'#include "{name}"\n', id=f"include-{name}") for name in ("encoder_forward.cu", "../kernels/x.cu")
] + [
    pytest.param(f"#define {FORWARD} not_mine\n", id="define-kernel-name"),
    pytest.param(f"#undef {FORWARD}\n", id="undef"),
    pytest.param('#line 1 "encoder_forward.cu"\n', id="line"),
    pytest.param('#pragma push_macro("x")\n', id="push-macro"),
    pytest.param('_Pragma("push_macro(\\"x\\")")\n', id="_Pragma"),
    pytest.param("%:define X 1\n", id="digraph"),
    pytest.param("  #  define X \\\n 1\n", id="spaced-define"),
    pytest.param("#def\\\nine X 1\n", id="spliced-define"),
    pytest.param("/* c */ #include <cstdio>\n", id="include-after-comment"),
    pytest.param("}\n__device__ void rest() {\n", id="closes-the-kernel"),
    pytest.param("if (1) {\n", id="open-brace"),
    pytest.param(f"{FORWARD}<<<1, 1>>>(out, inp, wte, wpe, B, T, C);\n", id="names-the-kernel"),
]


@pytest.mark.parametrize("body", CHEATS)
def test_bodies_that_could_swap_the_package_in_are_refused(body):
    with pytest.raises(SourceRejected):
        cudasource.prepare("forward", body + (CUDA_SOLUTIONS / "forward.cu").read_text())


def test_pragma_unroll_and_common_cuh_are_fine():
    body = "#pragma unroll\nfor (int k = 0; k < 4; k++) {}\n#pragma unroll 4\nfor (int k = 0; k < 4; k++) {}\n"
    cudasource.prepare("forward", body)
    whole = cudasource.fill("forward", (CUDA_SOLUTIONS / "forward.cu").read_text())
    cudasource.prepare("forward", whole.replace('#include "common.cuh"', "#include <common.cuh>"))


def test_whole_files_the_package_wrote_or_that_miss_the_kernel_are_refused():
    for name in ("encoder_forward.cu", "encoder_backward_wpe.cu"):
        text = kernel_source(name)
        for variant in (text, "// mine now\n" + text.replace("    ", "  "), text.replace("\n", "\n\n")):
            with pytest.raises(SourceRejected, match="package's own kernels/"):
                cudasource.prepare("forward" if name == "encoder_forward.cu" else "wpe", variant)
    whole = cudasource.fill("forward", (CUDA_SOLUTIONS / "forward.cu").read_text())
    twice = whole + whole[whole.index('extern "C" __global__ void encoder_forward_v2_kernel'):]
    with pytest.raises(SourceRejected, match="exactly once"):
        cudasource.prepare("forward", twice.replace('#include "common.cuh"', ""))
    with pytest.raises(SourceRejected, match="exactly once"):
        cudasource.prepare("forward", whole.replace(FORWARD, "my_kernel"))
    with pytest.raises(SourceRejected, match="include only common.cuh"):
        cudasource.prepare("forward", whole.replace('#include "common.cuh"', '#include "encoder_forward.cu"'))
    with pytest.raises(SourceRejected, match="include only common.cuh"):
        cudasource.prepare("forward", whole.replace('#include "common.cuh"', '#include "common.cuh"\n#define X 9'))
    assert (kernel_dir() / "common.cuh").is_file()


def test_compiler_messages_name_the_learners_lines():
    body = "\n    int idx = 0;\n    int x = ;\n"
    prepared = cudasource.prepare("forward", body)
    lines = prepared.source.splitlines()
    assert lines[prepared.first_line - 1 + 2].strip() == "int x = ;"  # the learner's line 3
    log = (f'/tmp/kern.cu({prepared.first_line + 2}): error: expected an expression\n'
           f'/tmp/kern.cu(3): warning: something in the header\n')
    mapped = cudasource.map_log(log, prepared, body.count("\n") + 1)
    assert "your line 3: error: expected an expression" in mapped and "skeleton line 3: warning" in mapped


def test_a_listing_is_collapsed_escaped_and_the_file_itself():
    source = kernel_source("encoder_backward_wte_chunked.cu")
    text = cudasource.listing(source, "kernels/encoder_backward_wte_chunked.cu <click>")
    assert text.startswith("<details><summary>") and text.endswith("</details>") and "<details open" not in text
    assert "<summary>kernels/encoder_backward_wte_chunked.cu &lt;click&gt;</summary>" in text
    shown = re.search(r'<code class="language-cuda">(.*)</code>', text, re.S).group(1)
    assert "<" not in shown and html.unescape(shown) == source
