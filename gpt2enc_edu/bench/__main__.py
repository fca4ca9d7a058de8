"""``python -m gpt2enc_edu.bench``: see ``gpt2enc_edu.bench.cli``."""

import sys

from .cli import main

sys.exit(main())
