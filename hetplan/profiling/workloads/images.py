"""Image-training input pipeline: JPEG decode, random-resized-crop, flip and normalise across worker processes.

The shape of an ImageNet-style training input pipeline, without a framework: `workers` processes (the
core count by default) each fill whole batches (decode with Pillow, RandomResizedCrop to `crop` pixels,
random horizontal flip, normalise with the ImageNet mean and std in NumPy, HWC -> CHW float32) into slots
of one anonymous shared-memory buffer; the main process takes each ready batch through a compute step
(pool, linear layer, softmax cross-entropy) standing in for the GPU, and reports it. No pickling of
pixels: only slot numbers cross the queues. The JPEGs are generated once, deterministically, by `prepare`.
"""

from __future__ import annotations

import json
import math
import mmap
import multiprocessing as mp
import os
import queue
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from hetplan.profiling.protocol import allocation

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)


def jpeg_dir(data_dir: str | os.PathLike[str], images: int, width: int, height: int, quality: int = 90,
             seed: int = 0) -> Path:
    """Where the JPEG set with these parameters lives under `data_dir`."""
    return Path(data_dir) / f"jpegs-{images}-{width}x{height}-q{quality}-s{seed}"


def ensure_jpegs(data_dir: str | os.PathLike[str], images: int = 256, width: int = 500, height: int = 375,
                 quality: int = 90, seed: int = 0) -> list[Path]:
    """Generate the JPEG set once (in a temporary folder renamed into place) and return its files.

    Each image is smooth random colour fields plus pixel noise, so decoding costs what a photo's does
    rather than what a flat colour's does. Same parameters, same bytes.
    """
    target = jpeg_dir(data_dir, images, width, height, quality, seed)
    if (target / "COMPLETE").exists():
        return sorted(target.glob("*.jpg"))
    target.parent.mkdir(parents=True, exist_ok=True)
    building = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(images):
        coarse = rng.integers(0, 256, size=(max(2, height // 32), max(2, width // 32), 3), dtype=np.uint8)
        smooth = np.asarray(Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC), np.int16)
        noisy = np.clip(smooth + rng.normal(0.0, 12.0, smooth.shape), 0, 255).astype(np.uint8)
        Image.fromarray(noisy).save(building / f"{i:06d}.jpg", quality=quality)
    (building / "COMPLETE").write_text(json.dumps({"images": images, "width": width, "height": height,
                                                   "quality": quality, "seed": seed}))
    try:
        building.rename(target)
    except OSError:  # another run finished the same set first
        shutil.rmtree(building, ignore_errors=True)
    return sorted(target.glob("*.jpg"))


def crop_box(width: int, height: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """A RandomResizedCrop box: area in `SCALE` of the image, aspect ratio log-uniform in `RATIO`.

    Ten tries; then the centre crop with the aspect ratio clamped to `RATIO`.
    """
    area = width * height
    log_low, log_high = math.log(RATIO[0]), math.log(RATIO[1])
    for _ in range(10):
        target = area * rng.uniform(*SCALE)
        aspect = math.exp(rng.uniform(log_low, log_high))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            x = int(rng.integers(0, width - w + 1))
            y = int(rng.integers(0, height - h + 1))
            return x, y, x + w, y + h
    ratio = width / height
    if ratio < RATIO[0]:
        w, h = width, round(width / RATIO[0])
    elif ratio > RATIO[1]:
        w, h = round(height * RATIO[1]), height
    else:
        w, h = width, height
    x, y = (width - w) // 2, (height - h) // 2
    return x, y, x + w, y + h


def load_sample(path: str | os.PathLike[str], crop: int, rng: np.random.Generator) -> np.ndarray:
    """Decode one JPEG and augment it: random-resized-crop to `crop`, maybe flip, normalise; CHW float32."""
    with Image.open(path) as source:
        rgb = source.convert("RGB")
    box = crop_box(rgb.width, rgb.height, rng)
    resized = rgb.resize((crop, crop), Image.Resampling.BILINEAR, box=box)
    pixels = np.asarray(resized, dtype=np.float32) * (1.0 / 255.0)
    if rng.random() < 0.5:
        pixels = pixels[:, ::-1]
    pixels = (pixels - MEAN) / STD
    return pixels.transpose(2, 0, 1)


def compute_step(batch: np.ndarray, weights: np.ndarray) -> float:
    """The stand-in for the accelerator: 8x8 average pool, linear layer, softmax cross-entropy on class 0."""
    b, c, h, w = batch.shape
    pooled = batch.reshape(b, c, h // 8, 8, w // 8, 8).mean(axis=(3, 5)).reshape(b, -1)
    logits = pooled @ weights
    logits -= logits.max(axis=1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-log_probs[:, 0].mean())


def prepare(params: dict[str, Any]) -> None:
    """Generate the JPEG set of a workload's parameters in the harness, once, before any point runs."""
    ensure_jpegs(params["data_dir"], **{k: params[k] for k in ("images", "width", "height", "quality", "seed")
                                        if k in params})


def run(report: Callable[[int], None], *, data_dir: str, images: int = 256, width: int = 500, height: int = 375,
        quality: int = 90, seed: int = 0, batch_size: int = 32, crop: int = 224, workers: int | None = None,
        prefetch: int = 2, steps: int | None = None) -> None:
    """Run the pipeline until stopped (or for `steps` batches), reporting each batch's samples."""
    if crop % 8:
        raise ValueError(f"crop must be a multiple of 8, got {crop}")
    paths = [str(p) for p in ensure_jpegs(data_dir, images, width, height, quality, seed)]
    workers = workers or allocation().workers
    slots = workers * max(1, prefetch)
    shape = (slots, batch_size, 3, crop, crop)
    shared = mmap.mmap(-1, int(np.prod(shape)) * 4)  # anonymous MAP_SHARED: forked workers write into it
    batches = np.ndarray(shape, dtype=np.float32, buffer=shared)
    context = mp.get_context("fork")  # the buffer and the queues are inherited, nothing is pickled
    free = [context.SimpleQueue() for _ in range(workers)]
    ready = context.Queue()
    procs = [context.Process(target=_worker, args=(w, paths, batches, free[w], ready, crop, seed), daemon=True)
             for w in range(workers)]
    for proc in procs:
        proc.start()
    for slot in range(slots):
        free[slot % workers].put(slot)
    weights = np.random.default_rng(seed).standard_normal((3 * (crop // 8) ** 2, 100)).astype(np.float32) * 0.01
    done = 0
    try:
        while steps is None or done < steps:
            slot = _next_ready(ready, procs)
            compute_step(batches[slot], weights)
            free[slot % workers].put(slot)
            report(batch_size)
            done += 1
    finally:
        for q in free:
            q.put(None)
        for proc in procs:
            proc.join(timeout=2.0)
            if proc.is_alive():
                proc.terminate()


def _next_ready(ready: Any, procs: list[Any]) -> int:
    while True:
        try:
            return int(ready.get(timeout=1.0))
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a pipeline worker died (exit code {dead[0].exitcode})") from None


def _worker(wid: int, paths: list[str], batches: np.ndarray, free: Any, ready: Any, crop: int, seed: int) -> None:
    rng = np.random.default_rng([seed, wid])
    while True:
        slot = free.get()
        if slot is None:
            return
        out = batches[slot]
        for i in range(out.shape[0]):
            out[i] = load_sample(paths[int(rng.integers(len(paths)))], crop, rng)
        ready.put(slot)
