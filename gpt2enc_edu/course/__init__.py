"""The course room: what only the notebooks use (plots, the block-scheduling model, exercise checkers).

Nothing here is needed to call the kernels; ``import gpt2enc_edu`` does not import it. Worked solutions live
outside the package, in the repository's ``solutions/`` folder.

``arrays()`` gives the notebooks their array module and says which backend runs the kernels; ``report()`` lists
which checks passed on this machine (``record`` says where they are recorded).
"""

from ..backend import array_module, gpu_status


def arrays(*, file=None):
    """The array module the notebooks run the kernels with (``gpt2enc_edu.array_module()``: CuPy where a CUDA GPU
    is usable, else NumPy), after printing it and ``gpu_status()``, the two lines notebook 01 prints by hand."""
    xp = array_module()
    print("arrays:", xp.__name__, "->", "the CUDA kernels" if xp.__name__ == "cupy" else "the NumPy mirror", file=file)
    print("gpu_status():", gpu_status(), file=file)
    return xp


def report(*, file=None, save=None) -> list[dict]:
    """Print which checks passed (one line per check) and return the rows; see ``course.record.report``."""
    from .record import report as _report

    return _report(file=file, save=save)
