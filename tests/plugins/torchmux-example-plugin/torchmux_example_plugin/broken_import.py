"""A plugin whose import fails: torchmux must report it and keep working."""

raise ImportError("torchmux_example_plugin.broken_import needs a library that is not installed (on purpose)")
