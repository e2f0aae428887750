"""``python -m profiler`` is the ``profiler`` command."""
from profiler.cli import main

main()
