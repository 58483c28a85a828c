"""torchmux.frontends"""
