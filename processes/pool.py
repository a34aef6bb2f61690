"""Local worker processes that never outlive the process that started them.

A ``ProcessPoolExecutor`` worker blocks on its call queue forever when its parent is
killed with SIGKILL (no shutdown message ever comes). :func:`local_pool` starts workers
whose initializer makes each a safe child (:func:`processes.children.adopt`): it dies with
the parent and imports nothing from the working directory. Workers are forked (where the
platform can), so they start with the parent's modules and import path rather than
re-importing the project through a fresh interpreter that would look in the working
directory first.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from processes.children import adopt


def local_pool(jobs: int) -> ProcessPoolExecutor:
    """A process pool of ``jobs`` workers that die with this process."""
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    return ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=adopt, initargs=(os.getpid(),))
