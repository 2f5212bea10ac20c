"""``advisor fit``'s training side: the user's script on fake tensors for a device it does not have.

Runs in the fitting process (``advisor.fit.bootstrap``), never in the controller. The parts:
``world`` (the fake world, entered around the script), ``tensors`` (fake tensors that say where
they are), ``functions`` (the script's device moves and factories), ``autocast`` (CUDA's policy),
``cuda_api`` (``torch.cuda`` answering for the target), ``modules`` (``module.to``), ``distributed``
(a fake world of N ranks, DDP on it), ``weights`` (checkpoints read as shapes), ``reads`` (values
fake tensors do not have) and ``run`` (one fit, and the event that says what it saw).
"""
