"""What a hardware record says about the machine it ran on: the device's name, its memory and
the load around the run (docs/performance-model.md#hardware-calibration)."""

from __future__ import annotations

import os
import platform

import torch


def capacity_bytes(dev) -> float:
    if dev.type == "cuda":
        return float(torch.cuda.get_device_properties(dev).total_memory)
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16e9


def device_name(dev) -> str:
    """What a report calls the device: the GPU's name, or the CPU's model and its logical CPUs."""
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    if dev.type == "mps":
        return f"Apple GPU (MPS) on {platform.machine()}"
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name} ({os.cpu_count()} logical CPUs)"


def loadavg() -> tuple[float, ...] | None:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except (OSError, AttributeError):
        return None


def table_device_name(device: torch.device) -> str:
    """The device as a calibrated table's provenance names it: "cpu", or "cuda (GPU name)"."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return str(device)
