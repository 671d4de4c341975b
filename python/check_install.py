#!/usr/bin/env python3
"""CI's check of the package as a user gets it: `pip install` into a fresh
virtual environment, then its pytest tests against the installed copy.

    check_install.py WORK_DIR      (ctest: WORK_DIR = <build tree>/python)

Everything is written under WORK_DIR, which is removed and made anew:
  WORK_DIR/src   a copy of python/ (pip builds in its source folder, leaving
                 build/ and *.egg-info there: not in the repository)
  WORK_DIR/venv  `python3 -m venv --system-site-packages`: fresh, with the
                 system's pytest and NumPy visible (scripts/setup installs
                 python3-pytest; Debian's python3-venv provides ensurepip)
  WORK_DIR/pytest-tmp  the tests' temporary folders (not in $TMPDIR)

Offline first: when the environment has setuptools (and wheel, for
setuptools < 70.1), `pip install --no-index --no-build-isolation`; otherwise
the plain `pip install`, which fetches setuptools from PyPI for the build.
Pytest comes from the system; when the interpreter has none, it is
pip-installed into the venv (PyPI). Each choice is printed.
"""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

PROBE_BACKEND = """
import sys
import setuptools
major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
if (major, minor) < (70, 1):
    import wheel  # setuptools' bdist_wheel before 70.1
print(setuptools.__version__)
"""


def run(*command, cwd=None):
    print("+", " ".join(command), flush=True)
    status = subprocess.run(command, cwd=cwd).returncode
    if status != 0:
        sys.exit(f"check_install: {os.path.basename(command[0])} {' '.join(command[1:3])} ... exited with {status}")


def quiet(*command, cwd=None):
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_install.py WORK_DIR")
    work = os.path.abspath(sys.argv[1])
    if os.path.exists(work) and not os.path.exists(os.path.join(work, ".flashcheck-check-install")):
        sys.exit(f"check_install: {work} exists and was not made by this script: not removing it")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    open(os.path.join(work, ".flashcheck-check-install"), "w").close()

    source = os.path.join(work, "src")
    shutil.copytree(HERE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache"))
    venv = os.path.join(work, "venv")
    run(sys.executable, "-m", "venv", "--system-site-packages", venv)
    python = os.path.join(venv, "bin", "python")

    backend = quiet(python, "-c", PROBE_BACKEND)
    if backend.returncode == 0:
        print(f"check_install: offline build with the environment's setuptools {backend.stdout.strip()}")
        run(python, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-deps", source, cwd=work)
    else:
        print("check_install: no setuptools (with wheel) in the environment: pip fetches the build backend")
        run(python, "-m", "pip", "install", source, cwd=work)

    if quiet(python, "-c", "import pytest").returncode != 0:
        print("check_install: no pytest for this interpreter (scripts/setup installs python3-pytest): "
              "pip-installing it into the venv")
        run(python, "-m", "pip", "install", "--quiet", "pytest", cwd=work)

    # The tests must import the installed package, not a source folder.
    where = quiet(python, "-c", "import flashcheck_worker; print(flashcheck_worker.__file__)", cwd=work)
    installed = os.path.realpath(where.stdout.strip())
    if where.returncode != 0 or not installed.startswith(os.path.realpath(venv) + os.sep):
        sys.exit(f"check_install: flashcheck_worker imports from {installed or where.stderr.strip()}, "
                 f"not from the venv {venv}")
    print(f"check_install: flashcheck_worker installed at {installed}")
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    run(python, "-m", "pytest", "-p", "no:cacheprovider", "--basetemp", os.path.join(work, "pytest-tmp"), "-q",
        os.path.join(source, "tests"), cwd=work)


if __name__ == "__main__":
    main()
