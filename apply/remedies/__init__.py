"""Appliers: ``apply/remedies/<name>.py`` defines ``apply_<name>(target, *, params) -> handle``.

The handle's ``revert()`` undoes the remedy exactly. The module also sets ``PHASE`` (one of
``advisor.records.remedy.PHASES``). ``advisor.apply.registry`` finds these modules with
``pkgutil``. A folder ``advisor/apply/remedies`` under another ``sys.path`` entry adds appliers
too (a test's faulty remedy, a third party's remedy) without editing this package: it joins
this package's ``__path__`` here. (``pkgutil.extend_path`` would search the parent package's
path instead, which holds only ours.)
"""

import os
import sys

__path__ = list(__path__)
for _entry in sys.path:
    _extra = os.path.join(_entry or os.curdir, "advisor", "apply", "remedies")
    if os.path.isdir(_extra) and not any(os.path.samefile(_extra, p) for p in __path__):
        __path__.append(_extra)
