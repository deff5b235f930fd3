"""The wheel ships the bundled data: models/*.yaml and hardware_profiles/*.yaml stay at the repository's
top level and are installed as advisor/models and advisor/hardware_profiles (pyproject.toml's
package-dir mapping); advisor.specs.bundled.bundled_dir picks the top-level folders in a checkout and
the packaged ones in a plain install."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from advisor.specs import bundled
from advisor.specs.bundled import bundled_dir

REPO = Path(__file__).resolve().parents[1]
DATA_FOLDERS = ("models", "hardware_profiles")
# What the wheel is built from (copied, so that the build's build/ and *.egg-info stay out of the checkout).
SOURCES = ("pyproject.toml", "README.md", "advisor", *DATA_FOLDERS)


_PROBE = """
import importlib.util, sys
if importlib.util.find_spec("setuptools") is None:
    sys.exit("setuptools is not importable (needed by --no-build-isolation)")
import setuptools
if int(setuptools.__version__.split(".")[0]) < 64:
    sys.exit(f"setuptools {setuptools.__version__} is older than pyproject.toml's setuptools>=64")
if importlib.util.find_spec("setuptools.command.bdist_wheel") is None and importlib.util.find_spec("wheel") is None:
    sys.exit("neither setuptools' own bdist_wheel (setuptools >= 70.1) nor the wheel package is importable")
"""


def _wheel_tools_missing() -> str | None:
    """Why a wheel cannot be built here without downloading anything, or None. Probed in a child
    process: importing setuptools here would clash with a stdlib distutils already imported."""
    if importlib.util.find_spec("pip") is None:
        return "pip is not importable"
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True)
    if done.returncode != 0:
        return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"probe exit {done.returncode}"
    return None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    reason = _wheel_tools_missing()
    if reason:
        pytest.skip(f"cannot build the wheel offline: {reason}")
    root = tmp_path_factory.mktemp("wheel")
    src, out = root / "src", root / "out"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
           "-w", str(out), str(src)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    wheels = sorted(out.glob("advisor-*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {out}, found {[w.name for w in out.iterdir()]}"
    with zipfile.ZipFile(wheels[0]) as zf:
        yield zf


@pytest.mark.parametrize("folder", DATA_FOLDERS)
def test_wheel_holds_every_bundled_yaml(wheel, folder):
    files = sorted((REPO / folder).glob("*.yaml"))
    assert files, f"no {folder}/*.yaml in the repository"
    names = set(wheel.namelist())
    missing = [p.name for p in files if f"advisor/{folder}/{p.name}" not in names]
    assert not missing, f"advisor/{folder}/ in the wheel lacks {missing}"
    for p in files:
        assert wheel.read(f"advisor/{folder}/{p.name}") == p.read_bytes(), p.name
    # Nothing lands at the top level of site-packages.
    assert not [n for n in names if n.startswith(f"{folder}/")]


def test_wheel_holds_the_package_and_its_other_data(wheel):
    names = set(wheel.namelist())
    # Every module: pyproject.toml names the packages one by one (a list cannot be mixed with
    # automatic discovery), so a new sub-package that is not added there would be missing.
    modules = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "advisor").rglob("*.py")
                     if "__pycache__" not in p.parts)
    assert not [m for m in modules if m not in names], "add the missing sub-packages to pyproject.toml's packages"
    data = ["advisor/graph/README.md", "advisor/validation/recsys_runs.yaml", "advisor/specs/recipes.yaml",
            *(p.relative_to(REPO).as_posix() for p in (REPO / "advisor/graph/examples").glob("*.json"))]
    assert not [d for d in data if d not in names]
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "advisor = advisor.cli:main" in wheel.read(entry_points).decode()


def test_bundled_dir_is_the_top_level_folder_in_a_checkout():
    from advisor.executor import matrix
    from advisor.specs.hardware import PROFILES_DIR
    from advisor.specs.model import MODELS_DIR

    for folder in DATA_FOLDERS:
        assert bundled_dir(folder) == REPO / folder
        assert bundled_dir(folder).is_dir()
    assert MODELS_DIR == REPO / "models"
    assert PROFILES_DIR == REPO / "hardware_profiles"
    assert matrix.PROFILES == REPO / "hardware_profiles"


def test_bundled_dir_falls_back_to_the_packaged_folder(tmp_path, monkeypatch):
    # A plain install: site-packages/advisor/models, and no pyproject.toml beside the package. An
    # unrelated top-level models/ folder there (another distribution's) is not taken for ours.
    site = tmp_path / "site-packages"
    (site / "advisor" / "models").mkdir(parents=True)
    (site / "models").mkdir()
    monkeypatch.setattr(bundled, "PACKAGE_ROOT", site / "advisor")
    monkeypatch.setattr(bundled, "REPO_ROOT", site)
    assert bundled_dir("models") == site / "advisor" / "models"
    assert bundled_dir("hardware_profiles") == site / "advisor" / "hardware_profiles"
