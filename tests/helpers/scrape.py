"""Reads a daemon's /metrics as Prometheus would, through prometheus-client's own parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def scrape(port: int) -> list[Sample]:
    url = f"http://127.0.0.1:{port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return [sample for family in text_string_to_metric_families(text)
            for sample in family.samples]


def value(samples: list[Sample], name: str, **labels: str) -> float | None:
    """The sample named `name` with exactly `labels`; None when there is none."""
    return next((s.value for s in samples if s.name == name and s.labels == labels), None)
