"""lm-eval scores log-likelihoods in right-padded batches (evals/adapter.py): a causal model's logits at the real
positions must not depend on the padding after them. A long run of one repeated pad token gives the Gated-DeltaNet
layers perfectly correlated keys; under a trained model's slow decay and strong write strength, a chunked delta rule
that is not exact in FP32 (the power-series WY inverse) blew up to inf in the padding, and attention's P·V (0 · inf)
carried the NaN back to every real position: the `consistent` default run's held-out perplexity was NaN in batches
and finite alone. Checked here on the model's forward, the path dm-eval's loglikelihood requests take."""

import math

import torch

from deltamatch.models import HybridForCausalLM, get_config


def _trained_like_gates(model: HybridForCausalLM, decay_per_token: float = 0.065, beta: float = 0.9) -> None:
    """Give every GDN layer the gates of the trained default checkpoints (measured on the `consistent` one: log decay
    −0.05 to −0.63 a token, β 0.15 to 0.92): here log decay −0.065 a token and β = 0.9 everywhere."""
    logit = math.log(beta / (1 - beta))
    with torch.no_grad():
        for layer in model.model.layers:
            mixer = layer.mixer
            if not hasattr(mixer, "A_log"):
                continue
            mixer.A_log.fill_(math.log(decay_per_token / math.log(2.0)))  # the gate is exp(A_log) · softplus(0)
            mixer.dt_bias.zero_()
            mixer.a_proj.weight.zero_()
            mixer.b_proj.weight.zero_()  # β = sigmoid(b_proj x + logit): b_proj has no bias, a hook adds it
            mixer.b_proj.register_forward_hook(lambda _module, _inputs, out: out + logit)


def test_real_positions_ignore_a_long_run_of_padding():
    torch.manual_seed(0)
    model = HybridForCausalLM(get_config("tiny", attn_method="bf16")).eval()
    _trained_like_gates(model)
    real = torch.randint(1, model.config.vocab_size, (1, 200))
    padded = torch.cat([real, torch.zeros(1, 440, dtype=torch.long)], dim=1)  # lm-eval pads with one token id
    with torch.no_grad():
        alone = model(real).logits[0]
        batched = model(torch.cat([padded, torch.randint(1, model.config.vocab_size, (1, 640))])).logits[0, :200]
    assert torch.isfinite(batched).all(), "right padding turned the real positions' logits non-finite"
    torch.testing.assert_close(batched, alone, rtol=1e-4, atol=1e-4)
