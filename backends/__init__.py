"""torchmux.backends"""
