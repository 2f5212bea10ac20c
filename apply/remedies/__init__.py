"""Appliers: ``apply/remedies/<name>.py`` defines ``apply_<name>(target, *, params) -> handle``.

The handle's ``revert()`` undoes the remedy exactly. The module also sets ``PHASE`` (one of
``advisor.records.remedy.PHASES``). ``advisor.apply.registry`` finds these modules with
``pkgutil``; ``extend_path`` lets a folder ``advisor/apply/remedies`` elsewhere on ``sys.path``
add appliers too (a test's faulty remedy, a third-party remedy), without editing this package.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
