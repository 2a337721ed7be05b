"""Test setup: use the installed mlafuse when there is one, else the source tree (which finds
the library through $MLAFUSE_LIBRARY or the repository's build/ directory)."""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if importlib.util.find_spec("mlafuse") is None:
    sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)  # reference.py
