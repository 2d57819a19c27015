"""Scraping ``/metrics`` over real HTTP and reading samples from the text format."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Key = tuple[str, frozenset[tuple[str, str]]]


class Scrape:
    """The samples of one scrape, by sample name and labels."""

    def __init__(self, text: str) -> None:
        self.samples: dict[Key, float] = {}
        self.families: set[str] = set()
        for family in text_string_to_metric_families(text):
            self.families.add(family.name)
            for sample in family.samples:
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def labelled(self, name: str) -> dict[frozenset[tuple[str, str]], float]:
        """Every sample of ``name``, by its labels."""
        return {labels: value for (sample, labels), value in self.samples.items() if sample == name}


async def scrape(url: str) -> Scrape:
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.get(url)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return Scrape(response.text)
