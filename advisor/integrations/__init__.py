"""Trainer callbacks that open an in-process session (advisor/api.py) for a training run:
``advisor.integrations.transformers.AdvisorCallback`` (Hugging Face ``Trainer``, ``advisor[hf]``)
and ``advisor.integrations.lightning.AdvisorCallback`` (Lightning, ``advisor[lightning]``). Each
module imports its trainer library; nothing else in the advisor imports them."""
