"""Per-process GPU activity through NVML, for the agent (optional: `pip install
'torch-hang-watchdog[nvml]'`). Without the package, a driver or a GPU, it reports nothing and
never fails: the verdict then rests on /proc and the stacks alone."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


class GpuSampler:
    """SM utilisation per pid over the time since the previous call, on every GPU of the node."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._devices: list[Any] = []
        self._last_seen: dict[int, int] = {}
        try:
            import pynvml

            pynvml.nvmlInit()
            self._devices = [pynvml.nvmlDeviceGetHandleByIndex(i)
                             for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
        except Exception as e:  # no package, no library, no driver, no device: no GPU evidence
            log.debug("no GPU activity evidence: %s", e)

    @property
    def available(self) -> bool:
        return self._nvml is not None and bool(self._devices)

    def utilization(self) -> dict[int, float]:
        """pid -> percent of SM time it used since the last call (the highest on any GPU)."""
        found: dict[int, float] = {}
        if not self.available:
            return found
        for index, device in enumerate(self._devices):
            try:
                samples = self._nvml.nvmlDeviceGetProcessUtilization(
                    device, self._last_seen.get(index, 0))
            except self._nvml.NVMLError:
                continue  # NVML_ERROR_NOT_FOUND: no process ran since the last call
            for sample in samples:
                self._last_seen[index] = max(self._last_seen.get(index, 0), sample.timeStamp)
                found[sample.pid] = max(found.get(sample.pid, 0.0), float(sample.smUtil))
        return found
