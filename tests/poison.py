"""NaN-filled ``torch.empty`` / ``empty_like``: code that forgets to write an output then fails a test.

Shared by ``conftest.py``'s autouse fixture and the Triton interpreter's child process, which fixtures do not reach.
"""

import torch


def poison_torch_empty(setattr_=setattr) -> None:
    """Replace the two constructors through ``setattr_`` (``monkeypatch.setattr`` in a fixture, so it is undone)."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def poisoned(out):
        if out.is_floating_point() and out.device.type != "meta":
            out.fill_(float("nan"))
        return out

    def empty(*args, **kwargs):
        # a Python wrapper is invisible to ``with torch.device(...)``: pass the default device on explicitly
        if kwargs.get("device") is None:
            kwargs["device"] = torch.get_default_device()
        return poisoned(real_empty(*args, **kwargs))

    setattr_(torch, "empty", empty)
    setattr_(torch, "empty_like", lambda *a, **k: poisoned(real_empty_like(*a, **k)))
