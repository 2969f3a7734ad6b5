"""Puts tests/ on sys.path (pytest's rootdir-relative import of this file does it): `import support` works
from every test directory."""
