"""Builds the optional C kernel of functional_bfo.random when FUNCTIONAL_BFO_C=1 (opt-in).

Everything else about the package is in pyproject.toml.
"""

import os

from setuptools import Extension, setup

C_KERNEL = Extension("functional_bfo._threefry", ["functional_bfo/_threefry.c"],
                     extra_compile_args=["-O3"])

setup(ext_modules=[C_KERNEL] if os.environ.get("FUNCTIONAL_BFO_C") == "1" else [])
