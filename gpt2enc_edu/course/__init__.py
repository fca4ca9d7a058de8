"""The course room: what only the notebooks use (plots, the block-scheduling model, exercise checkers).

Nothing here is needed to call the kernels; ``import gpt2enc_edu`` does not import it. Worked solutions live
outside the package, in the repository's ``solutions/`` folder.

``report()`` lists which checks passed on this machine (``record`` says where they are recorded).
"""


def report(*, file=None, save=None) -> list[dict]:
    """Print which checks passed (one line per check) and return the rows; see ``course.record.report``."""
    from .record import report as _report

    return _report(file=file, save=save)
