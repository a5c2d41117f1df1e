"""Corpus programs for the Python data model: containers, functions, classes, control flow."""
from corpus import PROGRAMS, T, TT, program, t  # noqa: F401
