"""Probes: run inside the training process, observe it, emit records.

Keep this file free of imports: the controller imports the torch-free modules
of this package (``records``, ``wire``) and must not pay for torch.
"""
