"""Shared pytest set-up: the tests folder on sys.path, so that tests import their helpers (helpers.py)."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
