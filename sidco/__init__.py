"""Front door of the SIDCo testbed: the ``sidco`` command line and the results store."""

__version__ = "0.1.0"
