"""Process hygiene: every process the testbed starts imports only the testbed and dies with its parent.

- :mod:`processes.children`: the argv of a child (``python -I``, the parent's import path without
  the working directory), dying with the parent, the ``/proc`` scan for running children.
- :mod:`processes.pool`: local worker pools whose workers are safe children.
- :mod:`processes.jobs`: a door's background jobs (the dashboard's sweeps and runs) as safe children.
- :mod:`processes.liveness`: whether a process is alive (the rule behind "left by a dead process").
- :mod:`processes.ranks`: the gloo rank starter of the DDP benchmark and tests (imports torch).

The bottom room: it imports nothing of the project, and emulation, measuring, the pipeline and
the dashboard import it.
"""
