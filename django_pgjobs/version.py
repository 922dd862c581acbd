"""The package's version, in a module of its own so that any module may read it (the
tracer names it) without importing the package's public surface."""

__version__ = "0.3.0.dev0"
