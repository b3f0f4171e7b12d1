"""`python -m hyquant_jax.cli`: the `hyquant` command."""

import sys

from hyquant_jax.cli.main import main

sys.exit(main())
