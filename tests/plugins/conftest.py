"""The plugin packages here are third-party projects: their own tests run in their own pytest, after
``pip install`` (tests/plugins/test_numpy_plugin.py does it), never in torchmux's collection."""

collect_ignore_glob = ["torchmux-*-plugin/*"]
