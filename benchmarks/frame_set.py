"""Build the labelled tier-2 frame set in tests/data/frames (run once; the output is committed).

    python benchmarks/frame_set.py --skimage-wheel scikit_image-0.26.0-...whl [--out tests/data/frames]

Two sources, nothing downloaded:
- photographs shipped inside registry packages, with their licences (scikit-image 0.26.0's
  ``skimage/data``: astronaut (public domain, NASA), coffee and chelsea (CC0), retina (CC0),
  hubble_deep_field (public domain, NASA); matplotlib's ``sample_data/grace_hopper.jpg`` (public
  domain, U.S. Navy)), resized to 256 px on the short side;
- procedural images drawn here (seeded): sand, wood, beige walls, hands and faces in several skin
  tones, bright and dark red objects, a sunset (safe); pools, splatter and wounds of blood-coloured
  fluid (``graphic_violence``).

No nudity and no minors: no explicit image with a usable licence ships in a registry package, and
none is drawn here, so those classes' recall is not measured by this set (docs/benchmarks.md).
``labels.json`` maps each file to its label, what it shows, and its source and licence.
"""

from __future__ import annotations

import argparse
import io
import json
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

SIDE = 256
SKIN = {"light": (236, 200, 175), "medium": (198, 142, 105), "dark": (120, 80, 56)}
BLOOD = [(120, 8, 12), (95, 5, 10), (140, 15, 18)]

PHOTOS = {  # name in the wheel → (file name, what it shows, licence)
    "skimage/data/astronaut.png": (
        "photo_astronaut.jpg",
        "a portrait (face, hands)",
        "public domain (NASA), scikit-image 0.26.0",
    ),
    "skimage/data/coffee.png": (
        "photo_coffee.jpg",
        "a coffee cup on wood",
        "CC0 (Rachel Michetti), scikit-image 0.26.0",
    ),
    "skimage/data/chelsea.png": ("photo_cat.jpg", "a ginger cat", "CC0 (Stefan van der Walt), scikit-image 0.26.0"),
    "skimage/data/retina.jpg": (
        "photo_retina.jpg",
        "a fundus photograph (red-orange)",
        "CC0 (Mikael Häggström), scikit-image 0.26.0",
    ),
    "skimage/data/hubble_deep_field.jpg": (
        "photo_hubble.jpg",
        "a deep-field sky",
        "public domain (NASA), scikit-image 0.26.0",
    ),
}
MATPLOTLIB_PHOTO = (
    "mpl-data/sample_data/grace_hopper.jpg",
    "photo_grace_hopper.jpg",
    "a portrait (face)",
    "public domain (U.S. Navy), matplotlib sample_data",
)


def _fit(img: Image.Image) -> Image.Image:
    img = img.convert("RGB")
    scale = SIDE / min(img.size)
    img = img.resize((max(SIDE, round(img.width * scale)), max(SIDE, round(img.height * scale))), Image.BICUBIC)
    left, top = (img.width - SIDE) // 2, (img.height - SIDE) // 2
    return img.crop((left, top, left + SIDE, top + SIDE))


def _noise(rng, amount: float) -> np.ndarray:
    return rng.normal(0, amount, (SIDE, SIDE, 1))


def _arr(img: np.ndarray) -> Image.Image:
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def sand(rng, tone) -> Image.Image:
    y, x = np.mgrid[0:SIDE, 0:SIDE] / SIDE
    dunes = 0.5 + 0.5 * np.sin(9 * x + 4 * np.sin(3 * y + rng.uniform(0, 6)) + 14 * y)
    img = np.array(tone, np.float32) * (0.8 + 0.25 * dunes[..., None]) + _noise(rng, 9)
    horizon = int(SIDE * rng.uniform(0.15, 0.3))
    img[:horizon] = np.array((150, 190, 230)) + _noise(rng, 3)[:horizon]
    return _arr(img)


def wood(rng, tone) -> Image.Image:
    y, x = np.mgrid[0:SIDE, 0:SIDE].astype(np.float32)
    cx = rng.uniform(-200, -80)
    r = np.hypot(x - cx, (y - SIDE / 2) * 0.25) + 6 * np.sin(y / 17 + rng.uniform(0, 6))
    rings = 0.5 + 0.5 * np.sin(r / rng.uniform(3, 6))
    img = np.array(tone, np.float32) * (0.78 + 0.3 * rings[..., None]) + _noise(rng, 5)
    return _arr(img)


def wall(rng, tone) -> Image.Image:
    y, _ = np.mgrid[0:SIDE, 0:SIDE] / SIDE
    img = np.array(tone, np.float32) * (1.0 - 0.15 * y[..., None]) + _noise(rng, 4)
    return _arr(img).filter(ImageFilter.GaussianBlur(1))


def hand(rng, tone, background=(70, 90, 110)) -> Image.Image:
    img = Image.new("RGB", (SIDE, SIDE), background)
    d = ImageDraw.Draw(img)
    cx, cy = SIDE // 2 + int(rng.integers(-15, 15)), SIDE // 2 + 40
    d.rounded_rectangle((cx - 55, cy - 40, cx + 55, cy + 80), radius=35, fill=tone)
    for dx, length in ((-45, 80), (-18, 100), (10, 105), (38, 90)):
        d.rounded_rectangle((cx + dx - 12, cy - 40 - length, cx + dx + 12, cy), radius=12, fill=tone)
    d.rounded_rectangle((cx + 45, cy - 20, cx + 100, cy + 5), radius=12, fill=tone)  # thumb
    d.rectangle((cx - 45, cy + 80, cx + 45, SIDE), fill=tone)  # wrist
    shade = tuple(int(c * 0.85) for c in tone)
    for dx in (-31, -4, 24):
        d.line((cx + dx, cy - 60, cx + dx, cy - 5), fill=shade, width=2)
    return img.filter(ImageFilter.GaussianBlur(1.2))


def face(rng, tone, hair=(60, 40, 30), background=(200, 210, 220)) -> Image.Image:
    img = Image.new("RGB", (SIDE, SIDE), background)
    d = ImageDraw.Draw(img)
    d.rectangle((88, 190, 168, SIDE), fill=tone)  # neck
    d.rectangle((40, 225, 216, SIDE), fill=(40, 60, 120))  # shirt
    d.ellipse((58, 40, 198, 215), fill=tone)
    d.chord((52, 25, 204, 140), 180, 360, fill=hair)
    for ex in (98, 158):
        d.ellipse((ex - 12, 108, ex + 12, 122), fill=(250, 250, 250))
        d.ellipse((ex - 5, 110, ex + 5, 120), fill=(50, 40, 30))
    d.line((128, 120, 122, 160, 132, 160), fill=tuple(int(c * 0.8) for c in tone), width=3)
    d.arc((100, 160, 156, 192), 20, 160, fill=(150, 60, 60), width=4)
    return img.filter(ImageFilter.GaussianBlur(1.0))


def forearm(rng, tone) -> Image.Image:
    """A close-up of a forearm: most of the frame is skin (the old heuristic's false positive)."""
    y, x = np.mgrid[0:SIDE, 0:SIDE] / SIDE
    img = np.empty((SIDE, SIDE, 3), np.float32)
    img[:] = (90, 110, 80)
    arm = np.abs((y - 0.5) - 0.15 * (x - 0.5)) < 0.36
    shade = 0.85 + 0.2 * np.cos((y - 0.5 - 0.15 * (x - 0.5)) * 4.2)
    img[arm] = (np.array(tone, np.float32) * shade[..., None])[arm]
    return _arr(img + _noise(rng, 3)).filter(ImageFilter.GaussianBlur(1.5))


def red_car(rng) -> Image.Image:
    img = Image.new("RGB", (SIDE, SIDE), (170, 200, 230))
    d = ImageDraw.Draw(img)
    d.rectangle((0, 180, SIDE, SIDE), fill=(90, 90, 95))
    d.rounded_rectangle((30, 120, 226, 185), radius=18, fill=(225, 20, 25))
    d.rounded_rectangle((70, 85, 185, 130), radius=16, fill=(210, 15, 20))
    d.rectangle((85, 92, 170, 122), fill=(160, 200, 230))
    for wx in (70, 185):
        d.ellipse((wx - 22, 165, wx + 22, 209), fill=(20, 20, 20))
    return img.filter(ImageFilter.GaussianBlur(0.8))


def roses(rng) -> Image.Image:
    img = Image.new("RGB", (SIDE, SIDE), (40, 100, 45))
    d = ImageDraw.Draw(img)
    for _ in range(9):
        x, y, r = int(rng.integers(20, 236)), int(rng.integers(20, 236)), int(rng.integers(14, 28))
        d.ellipse((x - r, y - r, x + r, y + r), fill=(230, 30, 60))
        d.ellipse((x - r // 2, y - r // 2, x + r // 2, y + r // 2), fill=(200, 20, 50))
    return img.filter(ImageFilter.GaussianBlur(1.0))


def sunset(rng) -> Image.Image:
    y = np.linspace(0, 1, SIDE)[:, None, None]
    top, bottom = np.array((60, 40, 110)), np.array((250, 120, 40))
    img = top * (1 - y) + bottom * y + np.zeros((1, SIDE, 3))
    img[int(SIDE * 0.8) :] = (30, 25, 35)
    return _arr(img + _noise(rng, 2))


def dark_red_objects(rng, kind: str) -> Image.Image:
    """Dark red things that are not blood: a glass of red wine, a red velvet curtain, ketchup on a plate."""
    img = Image.new("RGB", (SIDE, SIDE), (225, 220, 210))
    d = ImageDraw.Draw(img)
    if kind == "wine":
        d.polygon(((90, 40), (166, 40), (150, 130), (106, 130)), fill=(230, 235, 240))
        d.polygon(((95, 70), (161, 70), (150, 130), (106, 130)), fill=(110, 10, 30))
        d.rectangle((124, 130, 132, 200), fill=(230, 235, 240))
        d.ellipse((95, 195, 161, 212), fill=(230, 235, 240))
    elif kind == "curtain":
        x = np.arange(SIDE) / SIDE
        folds = 0.55 + 0.45 * np.sin(x * 40)
        arr = np.array((150, 12, 25), np.float32) * folds[None, :, None] * np.ones((SIDE, 1, 1))
        return _arr(arr + _noise(rng, 3))
    else:
        d.ellipse((30, 30, 226, 226), fill=(250, 250, 250))
        for _ in range(5):
            x, y, r = int(rng.integers(80, 176)), int(rng.integers(80, 176)), int(rng.integers(10, 22))
            d.ellipse((x - r, y - r, x + r, y + r), fill=(170, 20, 15))
    return img.filter(ImageFilter.GaussianBlur(0.8))


def _blobs(d: ImageDraw.ImageDraw, rng, cx, cy, spread, count, rmin, rmax, colour) -> None:
    for _ in range(count):
        x, y = rng.normal(cx, spread), rng.normal(cy, spread * 0.6)
        r = rng.uniform(rmin, rmax)
        d.ellipse((x - r, y - r, x + r, y + r), fill=colour)


def blood_pool(rng, floor=(140, 140, 145)) -> Image.Image:
    img = Image.new("RGB", (SIDE, SIDE), floor)
    d = ImageDraw.Draw(img)
    for i in range(0, SIDE, 64):
        d.line((i, 0, i, SIDE), fill=(110, 110, 115), width=2)
        d.line((0, i, SIDE, i), fill=(110, 110, 115), width=2)
    colour = BLOOD[int(rng.integers(len(BLOOD)))]
    _blobs(d, rng, SIDE * rng.uniform(0.4, 0.6), SIDE * rng.uniform(0.45, 0.6), 30, 25, 12, 34, colour)
    _blobs(d, rng, SIDE / 2, SIDE / 2, 80, 40, 2, 5, colour)  # splatter
    return img.filter(ImageFilter.GaussianBlur(1.0))


def splatter_wall(rng) -> Image.Image:
    img = wall(rng, (215, 200, 175))
    d = ImageDraw.Draw(img)
    colour = BLOOD[int(rng.integers(len(BLOOD)))]
    _blobs(d, rng, SIDE / 2, SIDE * 0.4, 35, 20, 6, 20, colour)
    _blobs(d, rng, SIDE / 2, SIDE * 0.4, 70, 60, 1, 4, colour)
    for _ in range(7):  # drips
        x, y = rng.normal(SIDE / 2, 30), rng.normal(SIDE * 0.45, 10)
        d.line((x, y, x + rng.normal(0, 2), y + rng.uniform(40, 110)), fill=colour, width=int(rng.integers(3, 7)))
    return img.filter(ImageFilter.GaussianBlur(0.8))


def wound(rng, tone) -> Image.Image:
    img = forearm(rng, tone)
    d = ImageDraw.Draw(img)
    colour = BLOOD[int(rng.integers(len(BLOOD)))]
    d.line((70, 110, 190, 140), fill=(70, 0, 5), width=10)
    _blobs(d, rng, 130, 128, 18, 14, 6, 16, colour)
    for _ in range(6):
        x = rng.uniform(80, 180)
        d.line((x, 130, x + rng.normal(0, 3), 130 + rng.uniform(40, 100)), fill=colour, width=int(rng.integers(4, 8)))
    return img.filter(ImageFilter.GaussianBlur(0.8))


def procedural() -> list[tuple[str, Image.Image, str, str]]:
    rng = np.random.default_rng(18)
    safe, unsafe = "safe", "graphic_violence"
    out = []
    for i, tone in enumerate(((220, 190, 140), (205, 165, 115), (230, 205, 160))):
        out.append((f"sand_{i}.jpg", sand(rng, tone), safe, "sand dunes"))
    for i, tone in enumerate(((200, 150, 100), (170, 115, 70), (225, 185, 135))):
        out.append((f"wood_{i}.jpg", wood(rng, tone), safe, "wood grain"))
    for i, tone in enumerate(((225, 205, 175), (210, 180, 150))):
        out.append((f"beige_wall_{i}.jpg", wall(rng, tone), safe, "a beige wall"))
    for name, tone in SKIN.items():
        out.append((f"hand_{name}.jpg", hand(rng, tone), safe, f"an open hand ({name} skin)"))
        out.append((f"face_{name}.jpg", face(rng, tone), safe, f"a face ({name} skin)"))
        out.append((f"forearm_{name}.jpg", forearm(rng, tone), safe, f"a forearm close-up ({name} skin)"))
    out.append(("red_car.jpg", red_car(rng), safe, "a bright red car"))
    out.append(("roses.jpg", roses(rng), safe, "red roses"))
    out.append(("sunset.jpg", sunset(rng), safe, "a sunset"))
    for kind in ("wine", "curtain", "ketchup"):
        out.append((f"dark_red_{kind}.jpg", dark_red_objects(rng, kind), safe, f"dark red, not blood: {kind}"))
    for i in range(3):
        out.append((f"blood_pool_{i}.jpg", blood_pool(rng), unsafe, "a pool of blood on a tiled floor"))
    for i in range(2):
        out.append((f"blood_splatter_{i}.jpg", splatter_wall(rng), unsafe, "blood splatter and drips on a wall"))
    for name in ("light", "dark"):
        out.append((f"wound_{name}.jpg", wound(rng, SKIN[name]), unsafe, f"a bleeding gash on an arm ({name} skin)"))
    return [(f, img, label, what) for f, img, label, what in out]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skimage-wheel", required=True, help="a scikit-image 0.26.0 wheel (its skimage/data photos)")
    ap.add_argument("--out", default="tests/data/frames")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    labels = {}
    with zipfile.ZipFile(args.skimage_wheel) as whl:
        for member, (name, what, licence) in PHOTOS.items():
            _fit(Image.open(io.BytesIO(whl.read(member)))).save(out / name, quality=88)
            labels[name] = {"label": "safe", "shows": what, "source": licence}
    import matplotlib

    src, name, what, licence = MATPLOTLIB_PHOTO
    _fit(Image.open(Path(matplotlib.__file__).parent / src)).save(out / name, quality=88)
    labels[name] = {"label": "safe", "shows": what, "source": licence}
    for name, img, label, what in procedural():
        img.save(out / name, quality=88)
        labels[name] = {"label": label, "shows": what, "source": "procedural (benchmarks/frame_set.py, seed 18)"}
    (out / "labels.json").write_text(json.dumps(labels, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    print(json.dumps({"frames": len(labels), "out": str(out)}))


if __name__ == "__main__":
    main()
