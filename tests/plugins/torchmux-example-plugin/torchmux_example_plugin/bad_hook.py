"""A plugin whose hook does not match the specification: pluggy rejects it at registration."""

import torchmux


@torchmux.hookimpl
def torchmux_add_backends(device_count):  # the specification takes no argument named device_count
    return []
