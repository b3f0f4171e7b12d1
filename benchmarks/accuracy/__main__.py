"""`python -m benchmarks.accuracy`: the accuracy benchmark's command."""

from benchmarks.accuracy.run import main
from benchmarks.common import run_script

run_script(main)
