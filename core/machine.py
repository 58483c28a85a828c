"""What kind of machine this is, for keys that must not travel between machines of different speed.

A decision measured on one CPU model or GPU is not trusted blindly on another: the decision key
(autotune/decisions.py) holds :func:`machine_kind` of the device the graph runs on.
"""

from __future__ import annotations

import functools
import os
import platform


@functools.cache
def machine_kind(device_type: str = "cpu") -> str:
    """``"cpu:<model name> x<cores>"`` or ``"cuda:<GPU name>"`` (the first GPU's, for any CUDA device)."""
    if device_type == "cuda":
        import torch

        try:
            return f"cuda:{torch.cuda.get_device_name(0)}"
        except Exception:
            return "cuda:?"
    return f"cpu:{_cpu_model()} x{os.cpu_count() or 0}"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "?"
