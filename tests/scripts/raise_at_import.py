import torch  # noqa: F401

raise RuntimeError("broken at import")
