"""Sphinx configuration for verispec's documentation."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "verispec"
author = "the verispec developers"
copyright = "2026, the verispec developers"
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_mock_imports = ["triton"]
napoleon_google_docstring = True
nitpicky = False
html_theme = "alabaster"
html_static_path = ["_static"]
exclude_patterns = ["_build"]
suppress_warnings = ["autodoc.import_object"]
