"""Build the Cython kernels in hymt/_kernels.

Every ``hymt/_kernels/*.pyx`` becomes an extension module ``hymt._kernels.<name>``. Builds are generic
(no ``-march=native``): SIMD code is compiled per function with target attributes and chosen at run
time (``hymt.kernels.isa()``). ``HYMT_NATIVE=1`` opts in to ``-march=native`` for a local build.
OpenMP is used when the compiler accepts ``-fopenmp``.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

KERNEL_DIR = os.path.join("hymt", "_kernels")

# Set once for every module (scikit-learn style); wrappers validate their inputs explicitly.
CYTHON_DIRECTIVES = {
    "language_level": 3,
    "boundscheck": False,
    "wraparound": False,
    "cdivision": True,
    "initializedcheck": False,
    "nonecheck": False,
    "embedsignature": True,
}


def compiler_accepts(flag: str) -> bool:
    """True when the C compiler builds and links a trivial OpenMP program with ``flag``."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write("#include <omp.h>\nint main(void) { return omp_get_max_threads() > 0 ? 0 : 1; }\n")
        cmd = [*cc.split(), flag, src, "-o", os.path.join(tmp, "probe")]
        return subprocess.run(cmd, capture_output=True).returncode == 0


def extensions() -> list[Extension]:
    compile_args = ["-O3", "-std=c11", "-ffp-contract=off", "-fno-strict-aliasing", "-Wno-unused-function"]
    link_args: list[str] = []
    if sys.platform != "win32" and compiler_accepts("-fopenmp"):
        compile_args.append("-fopenmp")
        link_args.append("-fopenmp")
    if os.environ.get("HYMT_NATIVE") == "1":
        compile_args.append("-march=native")
    headers = sorted(glob.glob(os.path.join(KERNEL_DIR, "*.h")))
    modules = []
    for pyx in sorted(glob.glob(os.path.join(KERNEL_DIR, "*.pyx"))):
        name = os.path.splitext(os.path.basename(pyx))[0]
        modules.append(
            Extension(
                f"hymt._kernels.{name}",
                [pyx],
                include_dirs=[KERNEL_DIR, np.get_include()],
                define_macros=[("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION")],
                extra_compile_args=compile_args,
                extra_link_args=link_args,
                depends=headers,
            )
        )
    return cythonize(modules, compiler_directives=CYTHON_DIRECTIVES, nthreads=os.cpu_count() or 1)


setup(ext_modules=extensions())
