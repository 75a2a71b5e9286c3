"""The package version, in the lowest module: every floor can say which version wrote a file (the store's
manifest, findings.json, a topology snapshot) without importing the package's top-level API."""

__version__ = "0.1.0"
