"""The public API and the command line, on top of every other layer: compile(), explain(), `torchmux`."""
