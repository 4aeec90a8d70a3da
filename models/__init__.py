"""deltamatch.models: the Gated-DeltaNet/GQA hybrid LMs as transformers models, their sizes and instrumentation.

Importing registers ``HybridConfig`` / ``HybridForCausalLM`` with ``AutoConfig`` / ``AutoModelForCausalLM``
(model type ``deltamatch_hybrid``); ``get_config(name, **overrides)`` builds a named size.
"""

from transformers import AutoConfig, AutoModelForCausalLM

from deltamatch.models.configuration_hybrid import HybridConfig
from deltamatch.models.modeling_hybrid import HybridForCausalLM, HybridModel
from deltamatch.models.sizes import get_config, list_configs

AutoConfig.register(HybridConfig.model_type, HybridConfig, exist_ok=True)
AutoModelForCausalLM.register(HybridConfig, HybridForCausalLM, exist_ok=True)

__all__ = ["HybridConfig", "HybridForCausalLM", "HybridModel", "get_config", "list_configs"]
