"""Orchestration shared by the ``sidco`` command line and the dashboard."""
