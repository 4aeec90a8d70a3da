"""Our checkpoints as an lm-eval model: lm-eval's own Hugging Face model class, registered as ``deltamatch``.

A checkpoint folder (``dm-train``'s ``final/``) is a transformers folder with the model code saved beside the weights,
so lm-eval's ``hf`` model loads it with ``trust_remote_code=True``; this subclass only fixes what that leaves to the
caller:

* it imports ``deltamatch.models`` first, which registers ``HybridConfig``/``HybridForCausalLM`` with the auto
  classes, so the installed code (not a copy in the folder) is what runs;
* it picks the device (CUDA when present, else CPU) and the causal backend;
* it generates one prompt at a time. Batched generation left-pads prompts, and the Gated-DeltaNet layers' recurrent
  state would absorb the padding (an attention mask hides pads from softmax attention, not from a recurrence).
  Log-likelihood requests stay batched: lm-eval right-pads them, and a causal model's logits at real positions never
  see the pads that follow.

``lm_eval run --model deltamatch --model_args pretrained=DIR`` works once this module is imported; ``dm-eval`` does so.
"""

from __future__ import annotations

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@register_model("deltamatch")
class DeltaMatchLM(HFLM):
    """lm-eval's HFLM for deltamatch hybrid checkpoints; see the module docstring for what differs."""

    def __init__(self, pretrained, device: str | None = None, **kwargs):
        import deltamatch.models  # noqa: F401  (registers the auto classes)

        kwargs["trust_remote_code"] = True
        kwargs.setdefault("backend", "causal")
        super().__init__(pretrained=pretrained, device=device or default_device(), **kwargs)

    def generate_until(self, requests, disable_tqdm: bool = False):
        batch_size = self.batch_size_per_gpu
        self.batch_size_per_gpu = 1
        try:
            return super().generate_until(requests, disable_tqdm=disable_tqdm)
        finally:
            self.batch_size_per_gpu = batch_size
