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
    return f"cpu:{cpu_model()} x{os.cpu_count() or 0}"


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo's, else what :mod:`platform` says)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "?"


#: The instruction-set extensions compilers target, as Linux's /proc/cpuinfo names them (x86 ``flags``,
#: Arm ``Features``). Native code built where one is present may use it (Inductor's vector ISA, TVM's
#: ``-mcpu`` of the host) and dies of SIGILL on a CPU without it; the other flags (a hypervisor's, a bug's)
#: say nothing of what code runs, and differ between hosts of one CPU model.
ISA_EXTENSIONS = frozenset(
    """sse3 pni ssse3 sse4_1 sse4_2 popcnt aes pclmulqdq avx avx2 fma f16c bmi1 bmi2 abm movbe adx sha_ni
    vaes vpclmulqdq gfni avx512f avx512dq avx512cd avx512bw avx512vl avx512ifma avx512vbmi avx512_vbmi2
    avx512_vnni avx512_bitalg avx512_vpopcntdq avx512_bf16 avx512_fp16 avx_vnni avx_vnni_int8 avx_ifma
    amx_tile amx_bf16 amx_int8 amx_fp16 fp asimd asimdhp asimddp asimdfhm fphp sve sve2 svebf16 svei8mm
    bf16 i8mm sha1 sha2 sha3 sha512 crc32 atomics lrcpc dcpop""".split()
)


@functools.cache
def isa_extensions() -> frozenset[str] | None:
    """Which of :data:`ISA_EXTENSIONS` this CPU has (the first processor's line of /proc/cpuinfo), or None
    where that cannot be read (no /proc: another OS)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split()) & ISA_EXTENSIONS
    except OSError:
        pass
    return None
