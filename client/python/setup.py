"""setup.py: the C extension kvcache._kvcache, linked with the tree's
libkvcache.a (run `make` at the top of the tree first; KVC_BUILD=dir to use
another build directory)."""
import glob
import os

from setuptools import Extension, setup

here = os.path.dirname(os.path.abspath(__file__))
top = os.path.abspath(os.path.join(here, "..", ".."))
build = os.path.join(top, os.environ.get("KVC_BUILD", "build"))  # relative: to the top
lib = os.path.join(build, "libkvcache.a")
if not os.path.exists(lib):
    raise SystemExit(f"kvcache: {lib} is missing: run `make` at the top of the kvcached tree "
                     "first (or set KVC_BUILD to a build directory)")

setup(ext_modules=[Extension(
    "kvcache._kvcache",
    sources=sorted(os.path.relpath(p, here) for p in glob.glob(os.path.join(here, "src", "*.c"))),
    include_dirs=[os.path.join(top, "include")],
    define_macros=[("_GNU_SOURCE", None)],
    extra_compile_args=["-std=c11", "-fvisibility=hidden"],
    extra_objects=[lib],
    libraries=["protobuf-c"],
)])
