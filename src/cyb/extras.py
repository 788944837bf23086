"""Optional packages: import one, or say in one line how to install it.

cyb's optional dependencies are the extras of its ``pyproject.toml`` (``lora``, ``data``,
``eval``, ``tensorboard``, ``kernels``, ``gguf``, ``trainer``, ``trl``, ``wandb``, ``reasoning``, ``serve``).  cyb is
installed from a clone (``scripts/setup.sh`` makes ``.venv``), so the install command is pip's
editable install of the clone with the extra.
"""

from __future__ import annotations

import importlib
import importlib.util

#: The extra of pyproject.toml that brings each optional package.
EXTRA_OF = {"peft": "lora", "datasets": "data", "pyarrow": "data", "lm_eval": "eval",
            "tensorboard": "tensorboard", "triton": "kernels", "gguf": "gguf",
            "accelerate": "trainer", "trl": "trl", "wandb": "wandb", "reasoning_gym": "reasoning",
            "starlette": "serve", "uvicorn": "serve"}


class MissingPackage(ImportError):
    """An optional package is not installed; the message says what needs it and how to install
    it, in one line (the command line prints it as its error)."""


def install_hint(package: str) -> str:
    """How to install ``package`` in a clone of cyb, and elsewhere."""
    extra = EXTRA_OF.get(package)
    if extra is None:
        return f"pip install {package}"
    return (f"in the cyb clone, .venv/bin/pip install -e '.[{extra}]' (or CYB_EXTRAS={extra} bash "
            f"scripts/setup.sh); in another environment, pip install {package}")


def missing(package: str, what: str) -> MissingPackage:
    """The error for ``what`` needing ``package``, which is not installed."""
    return MissingPackage(f"{what} needs the {package} package, which is not installed: {install_hint(package)}")


def available(package: str) -> bool:
    """Whether ``package`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a None entry in sys.modules, as tests use to hide a package
        return False


def require(module: str, what: str):
    """Import ``module``; :class:`MissingPackage` naming ``what`` needs it when its package is
    not installed.  An installed package that fails to import raises its own error."""
    package = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if e.name is not None and e.name.split(".")[0] != package:
            raise  # the package is there but one of its own dependencies is not
        raise missing(package, what) from None


__all__ = ["EXTRA_OF", "MissingPackage", "available", "install_hint", "missing", "require"]
