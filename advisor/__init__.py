"""The controller: CLI, session, store, reports and the terminal UI."""

__version__ = "0.1.0"
