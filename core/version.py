"""torchmux's version: written here once; pyproject.toml reads it (``[tool.setuptools.dynamic]``)."""

__version__ = "0.2.0"
