"""docs/architecture.svg is well-formed SVG, shows the three layouts, and README shows it."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SVG = ROOT / "docs" / "architecture.svg"
NS = "{http://www.w3.org/2000/svg}"


def test_svg_parses_and_names_the_parts():
    root = ET.parse(SVG).getroot()
    assert root.tag == f"{NS}svg"
    assert root.get("viewBox")
    text = " ".join("".join(t.itertext()) for t in root.iter(f"{NS}text"))
    for part in ("eaglenest up", "docker compose", "Several hosts", "load balancer",
                 "postgres", "redis", "minio", "worker-train", "worker-serve", "SQLite",
                 "queue train", "queue serve", "torchrun", "vLLM server"):
        assert part in text, part


def test_readme_shows_the_diagram():
    assert "![architecture](docs/architecture.svg)" in (ROOT / "README.md").read_text()
