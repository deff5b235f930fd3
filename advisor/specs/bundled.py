"""Where the bundled data folders (models/, hardware_profiles/) live.

They sit at the repository's top level. A source checkout or an editable install reads them there; a
wheel ships them inside the package as ``advisor/models`` and ``advisor/hardware_profiles`` (see
pyproject.toml's package-dir mapping), and a plain install reads them from there.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]   # .../advisor
REPO_ROOT = PACKAGE_ROOT.parent                      # the checkout in a source tree; site-packages in a wheel install


def bundled_dir(name: str) -> Path:
    """The bundled folder ``name``: the repository's top-level folder when this package runs from a
    checkout (the folder exists next to the package, beside pyproject.toml), else the copy installed
    inside the package. The pyproject.toml check keeps a wheel install from picking up an unrelated
    top-level ``models`` folder that some other distribution put into site-packages."""
    top = REPO_ROOT / name
    if top.is_dir() and (REPO_ROOT / "pyproject.toml").is_file():
        return top
    return PACKAGE_ROOT / name
