"""Display names of methods and runs, in the paper's style ("TBYS 3 pauses", "CYB 1 pause")."""

from __future__ import annotations

_BASE = {
    "baseline": "Baseline",
    "tbys": "TBYS",
    "tbys_original": "TBYS (original)",
    "cyb": "CYB",
    "cyb_va": "CYB-VA",
    "cyb_dp": "CYB-DP",
}


def _ratio(values) -> str:
    return ":".join(f"{float(v):g}" for v in values)


def method_label(method) -> str:
    """A short name for a :class:`~cyb.config.MethodConfig`: method, pauses and any non-default
    ``omega``, ``gamma``/``gamma0`` or Recipe 2 (e.g. ``"CYB 3 pauses (gamma0=0.99)"``)."""
    name = method.name
    if name == "baseline_nx":
        return f"Baseline {method.seq_multiplier}x seq"
    base = _BASE.get(name, name)
    if name == "baseline":
        return base
    pauses = method.num_steps - 1
    label = f"{base} {pauses} pause" + ("" if pauses == 1 else "s")
    extras = []
    if name == "tbys_original" and getattr(method, "tbys_scheme", "random") != "random":
        extras.append(f"{method.tbys_scheme} pauses")
    if getattr(method, "recipe", 1) == 2:
        extras.append("Recipe 2")
    if method.omega is not None:
        extras.append(f"omega={_ratio(method.omega)}")
    if method.name in ("cyb", "cyb_va", "cyb_dp"):
        if method.gamma0 is not None:
            extras.append(f"gamma0={method.gamma0:g}")
        elif method.gamma is not None:
            extras.append(f"gamma={_ratio(method.gamma)}")
    if method.name in ("cyb_va", "cyb_dp") and method.rho is not None:
        extras.append(f"rho={_ratio(method.rho)}")
    return label + (f" ({', '.join(extras)})" if extras else "")
