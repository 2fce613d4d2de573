"""The installed package's version: a leaf, so that a module recording it (in a store's, a summary's or a
table's provenance) imports this, never the package root (which loads the public facade)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("attnflow")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0+unknown"
