"""The plugin's own CI: torchmux's author kit, found through the installed entry point."""

from torchmux.testing import conformance_tests

test_numpy_interp = conformance_tests("numpy_interp")
