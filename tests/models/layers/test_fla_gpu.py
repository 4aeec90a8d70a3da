"""fla's chunk kernels on the H200 against independent references, at the 569M model's GDN head shape.

- Gated DeltaNet (``chunk_gated_delta_rule``, gate/beta/L2-norm in the kernel as the layer calls it) against the
  pure-torch twin in FP64: output, final state and the gradient of every input (q, k, v, gate, beta, A_log, dt_bias,
  initial state), T = 63 / 300 / 8192, B = 2, with and without an initial state, and for each warp count that fla may
  autotune ``prepare_wy_repr_bwd`` to (fla #984). These are the calls that
  :mod:`deltamatch.models.layers.fla_hopper` lets through fla's #640 guard; a head dim outside the verified set still
  meets fla's refusal.
- KDA (``chunk_kda``) against fla's token-by-token ``naive_recurrent_kda``, with fla's autotuning narrowed to one or
  two configs per kernel (a numerics check needs a valid config, not the fastest). BF16 inputs, as training's: with
  FP32 inputs at K = 128, V = 256 no launch config of fla's KDA state backward fits Hopper's shared memory
  (``fla_reference.kda_errors``; the 2026-12-01 suite failed there with Triton's OutOfResources).

The shapes are the 569M model's (9 heads x 128, values 256) with BF16 inputs, as training calls them, so Triton's
compiled kernels are shared with the training tests; the first case pays fla's autotuning (minutes on a fresh
machine), hence its long per-test limit. BF16 inputs put the errors near 1e-2; fla #640's wrong ``dk`` is a factor
of about 2 (error ~ 0.5 and up). tools/device/profile_step.py's ``verify`` items measure the same in FP32 (errors ~ 4e-3 at T = 8192).
"""

import pytest
import torch

from deltamatch.models.train.fla_autotune import restrict_warps
from deltamatch.models.layers.fla_hopper import refuses_gated_backward, training_backend
from fla_reference import gdn_errors, kda_errors, gdn_inputs

pytestmark = pytest.mark.gpu
B, H, K, V = 2, 9, 128, 256
BF16_TOLERANCE = 5e-2


@pytest.mark.timeout(480)  # the first case compiles and autotunes fla's GDN kernels
@pytest.mark.parametrize("warps", [2, 4])
@pytest.mark.parametrize("initial_state", [False, True])
@pytest.mark.parametrize("T", [63, 300, 8192])
def test_fla_gated_delta_rule_matches_fp64_twin(T, initial_state, warps):
    from fla.ops.gated_delta_rule import wy_fast

    assert training_backend(torch.device("cuda"), K)[0] == "fla"  # enables the verified backward where needed
    with restrict_warps(wy_fast.prepare_wy_repr_bwd_kernel, warps):
        errors = gdn_errors(B, T, H, K, V, initial_state, dtype=torch.bfloat16)
    assert max(errors.values()) < BF16_TOLERANCE, errors


@pytest.mark.timeout(240)
def test_unverified_head_dim_still_meets_flas_refusal():
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    device = torch.device("cuda")
    if not refuses_gated_backward(device):
        pytest.skip("fla trusts its own backward with this Triton")
    assert training_backend(device, 64)[0] == "torch"
    inputs = gdn_inputs(1, 64, 2, 64, 128, initial_state=False)
    o, _ = chunk_gated_delta_rule(**inputs, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                                  use_gate_in_kernel=True)
    with pytest.raises(RuntimeError, match="#640"):
        o.sum().backward()


@pytest.mark.timeout(240)  # compiles fla's KDA kernels, one or two configs each (tests/conftest.py narrows them)
@pytest.mark.parametrize("initial_state", [False, True])
@pytest.mark.parametrize("T", [63, 300])
def test_fla_kda_chunk_matches_recurrent_reference(T, initial_state):
    errors = kda_errors(2, T, 2, 128, 256, initial_state, dtype=torch.bfloat16)
    assert max(errors.values()) < BF16_TOLERANCE, errors
