"""Appliers: ``apply/remedies/<name>.py`` defines ``apply_<name>(target, *, params) -> handle``.

The handle's ``revert()`` undoes the remedy exactly. The module also sets ``PHASE`` (one of
``advisor.records.remedy.PHASES``), the phase its predictor's ``SPEC`` states
(tests/test_remedy_contract.py holds them equal, and the keywords to the spec's params).
``advisor.apply.registry`` finds these modules with ``pkgutil``. A folder ``advisor/apply/remedies``
under another ``sys.path`` entry adds appliers too without editing this package
(``advisor.records.plugins``).
"""

from advisor.records.plugins import with_plugins

__path__ = with_plugins(__path__, "advisor", "apply", "remedies")
