"""The cluster simulator: SimPy and closed-form models of data-parallel training iterations."""
