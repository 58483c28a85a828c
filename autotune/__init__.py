"""torchmux.autotune"""
