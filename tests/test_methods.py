"""The registry of backward methods (``gpt2enc_edu.methods``): every row is one the API runs as the row says."""

from __future__ import annotations

import numpy as np
import pytest

import gpt2enc_edu as enc
from gpt2enc_edu import cuda, methods, mirror, validate
from gpt2enc_edu.problems import random_problem
from gpt2enc_edu.rounding import bfloat16


@pytest.mark.parametrize("method", list(methods.METHODS.values()), ids=list(methods.METHODS))
def test_every_row_names_a_launcher_and_its_twin(method):
    for name in filter(None, (method.launcher, method.one_launch)):
        assert callable(getattr(cuda, name)) and callable(getattr(mirror, name))
    assert method.deterministic == method.needs_table  # the deterministic methods are the ones with a table
    assert set(method.dtypes) <= {"bf16", "fp32"}
    assert method.table in (None, "units", "buckets")


def test_validation_and_the_default_read_the_registry():
    assert validate.METHODS == tuple(methods.METHODS)
    assert methods.DEFAULT_METHOD in methods.METHODS
    assert validate.DETERMINISTIC_METHODS == tuple(m for m, row in methods.METHODS.items() if row.deterministic)


@pytest.mark.parametrize("dtype", [bfloat16, np.float32], ids=["bf16", "fp32"])
def test_a_method_runs_on_the_dtypes_its_row_names(rng, dtype):
    for method in methods.METHODS.values():
        p = random_problem(2, 8, 16, 9, 8, dtype=dtype, ids="uniform", rng=rng)
        before = p.dwte.copy()
        call = lambda: enc.encoder_backward(p.dwte, p.dwpe, p.dout, p.inp, seed=1, method=method.name)  # noqa: E731
        if method.takes(dtype):
            call()
            assert not np.array_equal(p.dwte.view(np.uint8), before.view(np.uint8))
        else:
            with pytest.raises(ValueError, match=f"method={method.name!r} needs"):
                call()
            assert np.array_equal(p.dwte.view(np.uint8), before.view(np.uint8))


def test_one_launch_only_for_a_row_that_has_one():
    for method in methods.METHODS.values():
        assert methods.one_launch_backward(method.name, "gpu", 8, 100) == (method.one_launch is not None)
    assert not methods.one_launch_backward("no such method", "gpu", 8, 100)


def test_the_api_docstring_lists_every_method_with_its_notes():
    doc = " ".join(enc.encoder_backward.__doc__.split())  # the list is wrapped: compare with white space folded
    for method in methods.METHODS.values():
        default = " (the default)" if method.name == methods.DEFAULT_METHOD else ""
        assert f'``"{method.name}"``{default}: {method.notes}' in doc
    assert "{methods}" not in doc
