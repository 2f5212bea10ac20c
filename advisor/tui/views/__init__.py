"""The TUI's views, one per file; each has ``update_model(model: ViewModel)`` and reads nothing else."""
