"""kvc_build_backend.py: the build backend of pyproject.toml: setuptools'
own, made to work offline. pip builds in an isolated environment and would
fetch setuptools and wheel from an index; with none reachable, this finds
Debian's python3-setuptools and python3-wheel instead and asks pip for
nothing more."""
import sys

try:
    import setuptools.build_meta  # noqa: F401
    import wheel  # noqa: F401
except ImportError:
    sys.path.append("/usr/lib/python3/dist-packages")  # Debian's packages

from setuptools.build_meta import *  # noqa: F401,F403,E402  (every hook of the backend)


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []
