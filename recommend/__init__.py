"""Recommender: pure functions from a recorded profile to a diagnosis and ranked remedies.

Never imports torch (a test checks): it works on any saved session.
"""
