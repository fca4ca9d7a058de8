from ._legacy import *  # noqa: F401,F403  (temporary while the bench package is split)
from ._legacy import _positive_int, main  # noqa: F401
