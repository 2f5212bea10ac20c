"""The training process's composition root: bootstrap, global hooks, the agent, its channel.

It wires ``advisor.probes`` and ``advisor.apply`` together; nothing in the controller imports it.
"""
