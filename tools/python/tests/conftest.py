"""Make ``hspack.capture`` importable from the source tree.

When the package's ``hspack/__init__.py`` (which loads the compiled extension)
is absent, ``tools/python/python`` is put on ``sys.path`` so that
``hspack.capture`` imports as a namespace package.
"""

import os
import sys

_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")

if not os.path.exists(os.path.join(_ROOT, "hspack", "__init__.py")):
    sys.path.insert(0, _ROOT)
