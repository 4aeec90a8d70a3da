"""The tiny hybrid LM on the CPU: every attention method trains, the loss is HF's, checkpoints round-trip, generation
with the cache equals generation without it."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from deltamatch.kernels import PUBLIC_MODES
from deltamatch.kernels.reference import attention_reference
from deltamatch.models import HybridConfig, HybridForCausalLM, get_config

VOCAB = 256


def tiny(**overrides) -> HybridForCausalLM:
    torch.manual_seed(0)
    return HybridForCausalLM(get_config("tiny", vocab_size=VOCAB, **overrides))


def tokens(B=2, T=48, seed=1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("method", PUBLIC_MODES)
def test_forward_backward_each_method(method):
    model = tiny(attn_method=method)
    x = tokens(T=24)
    loss = model(x, labels=x).loss
    loss.backward()
    assert torch.isfinite(loss)
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_attention_core_is_the_methods_reference_simulation():
    model = tiny(attn_method="matched")
    seen = {}
    core = model.attention_layers()[0][1].core
    core.register_forward_hook(lambda m, args, out: seen.update(args=args, out=out))
    x = tokens(T=33)
    model(x, labels=x).loss.backward()
    q, k, v = (t.detach() for t in seen["args"][:3])
    assert torch.equal(seen["out"].detach(), attention_reference(q, k, v, True, "matched"))


def test_loss_is_shifted_mean_cross_entropy():
    model = tiny()
    x = tokens()
    labels = x.clone()
    labels[0, :5] = -100
    with torch.no_grad():
        out = model(x, labels=labels)
    expected = F.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)
    assert torch.allclose(out.loss, expected, rtol=1e-6)


def test_layer_pattern_and_attention_layers():
    model = tiny()
    assert model.config.layer_pattern == ["gdn", "gdn", "gdn", "gqa"]
    [(index, attn)] = model.attention_layers()
    assert index == 3 and attn.q_norm.weight.shape == (32,) and attn.k_norm.weight.shape == (32,)
    assert tiny(qk_norm=False).attention_layers()[0][1].q_norm is None


def test_bad_config_names_the_key():
    with pytest.raises(ValueError, match="attn_method"):
        HybridConfig(attn_method="fp4")
    with pytest.raises(ValueError, match="num_key_value_heads"):
        HybridConfig(num_attention_heads=4, num_key_value_heads=3)
    with pytest.raises(ValueError, match="unknown model size"):
        get_config("7B")


def test_save_load_round_trip_is_bit_exact(tmp_path):
    model = tiny(attn_method="matched")
    model.save_pretrained(tmp_path)
    loaded = HybridForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.attn_method == "matched"
    state, state2 = model.state_dict(), loaded.state_dict()
    assert state.keys() == state2.keys()
    assert all(torch.equal(state[k], state2[k]) for k in state)
    x = tokens()
    with torch.no_grad():
        assert torch.equal(model.eval()(x).logits, loaded.eval()(x).logits)


def test_from_pretrained_with_remote_code_in_a_fresh_process(tmp_path):
    model = tiny().eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "modeling_hybrid.py").exists() and (tmp_path / "configuration_hybrid.py").exists()
    x = tokens(B=1, T=12)
    with torch.no_grad():
        expected = model(x).logits
    torch.save(x, tmp_path / "x.pt")
    code = (
        "import sys, torch\n"
        "from transformers import AutoModelForCausalLM\n"
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)\n"
        "assert 'deltamatch' not in type(m).__module__, type(m).__module__\n"
        "with torch.no_grad(): torch.save(m.eval()(torch.load(sys.argv[1] + '/x.pt')).logits, sys.argv[1] + '/y.pt')\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, capture_output=True, timeout=120)
    assert torch.equal(torch.load(tmp_path / "y.pt"), expected)


def test_generate_with_cache_equals_without():
    model = tiny().eval()
    x = tokens(B=2, T=70)  # the prompt spans two GDN chunks
    cached = model.generate(x, max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0)
    uncached = model.generate(x, max_new_tokens=6, do_sample=False, use_cache=False, pad_token_id=0)
    assert cached.shape == (2, 76) and torch.equal(cached, uncached)
    with torch.no_grad():  # and the logits along the way, not only the argmax
        full = model(cached, use_cache=False).logits[:, 69:-1]
        out = model(cached[:, :70], use_cache=True)
        steps = [out.logits[:, -1]]
        for t in range(70, cached.shape[1] - 1):
            out = model(cached[:, t : t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits[:, -1])
    torch.testing.assert_close(torch.stack(steps, 1), full, rtol=1e-4, atol=1e-4)


def test_left_padded_batch_generates_like_each_prompt_alone():
    model = tiny().eval()
    short, long = tokens(B=1, T=9, seed=3), tokens(B=1, T=14, seed=4)
    batch = torch.cat([F.pad(short, (5, 0), value=0), long])
    mask = torch.ones_like(batch)
    mask[0, :5] = 0
    together = model.generate(batch, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    alone = model.generate(
        short, attention_mask=torch.ones_like(short), max_new_tokens=5, do_sample=False, pad_token_id=0
    )
    assert torch.equal(together[0, 14:], alone[0, 9:])


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_reproduces_the_gradients(reentrant):
    model = tiny(attn_method="matched")
    x = tokens(T=20)
    model(x, labels=x).loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model(x, labels=x).loss.backward()
    for name, p in model.named_parameters():
        assert torch.equal(p.grad, expected[name]), name


def test_core_choice_in_eval_mode():
    x = tokens(T=30)
    model = tiny(attn_method="stale").eval()
    with torch.no_grad():
        sdpa = model(x).logits
    method = model(x).logits.detach()  # grad on: the method's core, as the probes see it
    same_weights = tiny(attn_method="stale", attn_inference="method").eval()
    with torch.no_grad():
        assert torch.equal(same_weights(x).logits, method)
    assert not torch.equal(sdpa, method)  # FP8 simulation vs exact attention
    torch.testing.assert_close(sdpa, method, rtol=0.1, atol=0.1)
