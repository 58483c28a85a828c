"""torchmux's core: the IR, the hook specifications, the registry, the public API."""
