"""lousho's version, in one place: pyproject reads it for the wheel, `lousho.__version__` and
`lousho --version` print it, and releases.toml records each released one with its commit (issue #35).

Between releases it is the next release's number with `.devN`, so a wheel built from main never
claims to be a release it is not.
"""

__version__ = "0.2.0.dev0"
