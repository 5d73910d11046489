#!/usr/bin/env python3
"""Regenerate every Needle Studio app icon from icons/icon.svg.

Usage (from anywhere):
    python3 icons/make_icons.py

Needs:
    rsvg-convert  - Debian/Ubuntu: apt-get install -y librsvg2-bin
    Pillow        - pip install pillow

Writes next to this script (the names Tauri's bundler expects):
    32x32.png, 128x128.png, 128x128@2x.png (256), icon.png (512),
    icon.icns (macOS, 16..1024), icon.ico (Windows: 16, 24, 32, 48, 64, 256).
Every PNG is 8-bit RGBA (colour type 6); Tauri rejects anything else.
"""
import io
import subprocess
from pathlib import Path

from PIL import Image

HERE = Path(__file__).resolve().parent
SVG = HERE / "icon.svg"


def render(size: int) -> Image.Image:
    """Render icon.svg at size x size straight from the vector (crisp at every size)."""
    png = subprocess.run(
        ["rsvg-convert", "-w", str(size), "-h", str(size), str(SVG)],
        check=True, capture_output=True,
    ).stdout
    return Image.open(io.BytesIO(png)).convert("RGBA")


def main() -> None:
    for name, size in [("32x32.png", 32), ("128x128.png", 128),
                       ("128x128@2x.png", 256), ("icon.png", 512)]:
        render(size).save(HERE / name, optimize=True)

    ico_sizes = [16, 24, 32, 48, 64, 256]
    # ICO: largest image as base; each listed size is taken from its own rendering.
    ico = {s: render(s) for s in ico_sizes}
    ico[256].save(HERE / "icon.ico", format="ICO",
                  sizes=[(s, s) for s in ico_sizes],
                  append_images=[ico[s] for s in ico_sizes[:-1]])

    # ICNS: Pillow writes the standard sizes (16..1024) from the provided images.
    icns = [render(s) for s in (16, 32, 64, 128, 256, 512)]
    render(1024).save(HERE / "icon.icns", format="ICNS", append_images=icns)

    for p in sorted(HERE.iterdir()):
        print(f"{p.name:18} {p.stat().st_size:>8} bytes")


if __name__ == "__main__":
    main()
