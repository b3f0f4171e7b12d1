"""`python -m benchmarks.e2e`: the end-to-end benchmark's command (its parent process, or one worker)."""

from benchmarks.common import run_script
from benchmarks.e2e.run import main

run_script(main)
