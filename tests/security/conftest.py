"""Security tests: each attack of issue 11 run by an unprivileged user (`nobody`, through
setpriv) against real daemons running as root. tests/conftest.py stops the run at once, with the
fix, when this machine cannot do that: not root, no setpriv, py-spy missing, or `nobody` unable
to run this interpreter and import the package."""

from __future__ import annotations
