"""Builds the C kernel of functional_bfo.random; without a C compiler, numpy serves instead.

``FUNCTIONAL_BFO_C=0`` skips the build; ``FUNCTIONAL_BFO_C=1`` makes a failed build an error
(CI, which must test the kernel). Everything else about the package is in pyproject.toml.
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CHOICE = os.environ.get("FUNCTIONAL_BFO_C", "")
C_KERNEL = Extension("functional_bfo._threefry", ["functional_bfo/_threefry.c"],
                     extra_compile_args=["-O3"])


class OptionalKernel(build_ext):
    """``build_ext`` that falls back to the numpy kernel, saying so, when it cannot compile."""

    def build_extension(self, ext):  # noqa: D102 (setuptools documents it)
        try:
            super().build_extension(ext)
        except Exception as e:  # no compiler, no Python headers: numpy serves
            if CHOICE == "1":
                raise
            print(f"functional_bfo: the C kernel could not be built ({e}); the numpy kernel "
                  "will draw the CPU's random numbers instead (the same numbers, about 2.4x "
                  "slower per compiled update). Install a C compiler and Python's headers, "
                  "then reinstall, to build it.", file=sys.stderr)


setup(ext_modules=[] if CHOICE == "0" else [C_KERNEL], cmdclass={"build_ext": OptionalKernel})
