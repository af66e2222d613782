"""The portable edition's plain script in the package (pyproject.toml holds
everything else): pg_idempotency/idempotency-portable.sql is made from the
repository's portable/*.sql (helpers/portable-sql.sh, i.e. portable/build.sh)
whenever the package is built from a checkout or a release tarball: pip
install, a wheel, an sdist. An sdist carries the file, so a build from an
unpacked sdist (no portable/ beside it) uses the one it has. The file is
not in git (.gitignore)."""
import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.egg_info import egg_info

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "portable-sql.sh")
DEST = os.path.join(HERE, "pg_idempotency", "idempotency-portable.sql")


def make_portable_sql():
    if os.path.exists(SCRIPT):
        subprocess.run(["sh", SCRIPT, DEST], check=True)
    elif not os.path.exists(DEST):
        raise SystemExit("pg-idempotency: neither ../portable-sql.sh (a checkout or release tarball of "
                         "idempotency) nor pg_idempotency/idempotency-portable.sql (an sdist): "
                         "cannot build the package without the portable edition's script")


class BuildPy(build_py):
    def run(self):
        make_portable_sql()
        super().run()


class EggInfo(egg_info):
    # before the sdist's and the wheel's file lists are made
    def run(self):
        make_portable_sql()
        super().run()


setup(cmdclass={"build_py": BuildPy, "egg_info": EggInfo})
