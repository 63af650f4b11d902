"""What deploy/container/Containerfile does, short of a container engine (none here): the wheel
builds from the sources it copies, and installs with its dependencies (py-spy among them) into a
clean virtualenv whose `watchdog` runs the daemons' new options."""

from __future__ import annotations

import re
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "container" / "Containerfile"


def run(*argv: str | Path) -> str:
    out = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_the_image_recipe_builds_and_installs_the_wheel(tmp_path: Path) -> None:
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", CONTAINERFILE.read_text(), re.M)
    sources = tmp_path / "src"
    for words in copied:  # the build stage's context: what the Containerfile copies, alone
        for name in words.split():
            path = ROOT / name
            target = sources / name
            if path.is_dir():
                subprocess.run(["cp", "-r", str(path), str(target)], check=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(path.read_bytes())
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
        "--wheel-dir", tmp_path / "wheels", sources)
    (wheel,) = (tmp_path / "wheels").glob("torch_hang_watchdog-*.whl")
    venv.create(tmp_path / "venv", with_pip=True)
    bin_dir = tmp_path / "venv" / "bin"
    run(bin_dir / "pip", "install", "-q", wheel)
    assert "py-spy" in run(bin_dir / "py-spy", "--version")
    assert "--metrics-listen" in run(bin_dir / "watchdog", "coordinator", "--help")
    assert "--health-listen" in run(bin_dir / "watchdog", "agent", "--help")
    boot = run(bin_dir / "python", "-c", "import watchdog.supervise.inject as i; print(i.BOOT_DIR)")
    assert (Path(boot.strip()) / "sitecustomize.py").is_file()  # `watchdog launch` needs it


def test_every_stage_starts_from_the_base_image_pinned_by_digest() -> None:
    """A tag moves (and whoever controls it chooses what runs as root on every node); a
    digest names one image."""
    text = CONTAINERFILE.read_text()
    (base,) = re.findall(r"^ARG BASE=(\S+)$", text, re.M)
    assert re.fullmatch(r"docker\.io/library/python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", base)
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["${BASE}", "${BASE}"]
