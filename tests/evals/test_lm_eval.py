"""lm-eval run for real on CPU on a tiny trained checkpoint: through dm-eval, and through lm-eval's own CLI."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from deltamatch.evals.runner import evaluate_suite
from deltamatch.evals.suites import TASKS_DIR, load_suite

pytestmark = pytest.mark.slow

SUITE = """name: smoke
task_dirs: [offline]
needs_data: true
model_args: {batch_size: 4, max_length: 1024}
runs:
  - metadata: {max_seq_lengths: [512]}
    tasks:
      - {task: dm_lastword, average: acc, report: [acc_norm], limit: 6}
      - {task: dm_heldout_ppl, report: [word_perplexity, bits_per_byte], limit: 2}
      - {task: dm_ruler_fwe, average: score, limit: 1}
"""


def _reference_lastword_acc(ckpt: Path, items: list[dict]) -> float:
    """Our own scoring of the cloze: sum of log-probs of ' ' + choice after the context, argmax against gold."""
    import deltamatch.models  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(ckpt)
    hits = 0
    for item in items:
        ctx = tok(item["context"]).input_ids
        scores = []
        for choice in item["choices"]:
            cont = tok(item["context"] + " " + choice).input_ids[len(ctx):]
            ids = torch.tensor([ctx + cont])
            with torch.no_grad():
                logp = model(ids).logits.float().log_softmax(-1)[0, len(ctx) - 1: -1]
            scores.append(logp.gather(-1, torch.tensor(cont)[:, None]).sum().item())
        hits += int(max(range(len(scores)), key=scores.__getitem__) == item["gold"])
    return hits / len(items)


def test_dm_eval_matches_reference_and_lm_eval_cli(tiny_run, tmp_path):
    ckpt, data = tiny_run
    suite_path = tmp_path / "smoke.yaml"
    suite_path.write_text(SUITE)
    record = evaluate_suite(ckpt, load_suite(suite_path), data_dir=data, cache_dir=tmp_path / "cache")
    assert record["lm_eval_version"] == "0.4.13" and record["suite"] == "smoke"
    assert record["n_samples"] == {"dm_lastword": 6, "dm_heldout_ppl": 2, "dm_ruler_fwe": 1}
    tasks = record["tasks"]
    assert 0.0 <= tasks["dm_ruler_fwe"]["score"] <= 1.0
    assert tasks["dm_heldout_ppl"]["bits_per_byte"] > 0 and tasks["dm_heldout_ppl"]["word_perplexity"] > 1
    assert record["average"] == pytest.approx((tasks["dm_lastword"]["acc"] + tasks["dm_ruler_fwe"]["score"]) / 2)
    assert record["metric_per_task"] == {"dm_lastword": "acc", "dm_ruler_fwe": "score"}

    from deltamatch.evals.offline_tasks import build_offline_data

    local = build_offline_data(data, tmp_path / "local")
    items = [json.loads(line) for line in open(local["dm_lastword_jsonl"])][:6]
    assert tasks["dm_lastword"]["acc"] == pytest.approx(_reference_lastword_acc(ckpt, items))

    # lm-eval's own CLI and its stock hf model load the exported folder through trust_remote_code.
    out = tmp_path / "lm_eval_out"
    cmd = [str(Path(sys.executable).with_name("lm_eval")), "run", "--model", "hf",
           "--model_args", f"pretrained={ckpt},trust_remote_code=True,dtype=float32", "--device", "cpu",
           "--tasks", "dm_lastword", "--include_path", str(TASKS_DIR / "offline"), "--limit", "6",
           "--metadata", json.dumps(local), "--output_path", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(out.rglob("results_*.json")).read_text())
    assert result["results"]["dm_lastword"]["acc,none"] == pytest.approx(tasks["dm_lastword"]["acc"])


@pytest.mark.gpu
def test_dm_eval_on_gpu(tiny_run, tmp_path):
    ckpt, data = tiny_run
    suite_path = tmp_path / "smoke.yaml"
    suite_path.write_text(SUITE)
    record = evaluate_suite(ckpt, load_suite(suite_path), data_dir=data, cache_dir=tmp_path / "cache", device="cuda")
    assert record["n_samples"] == {"dm_lastword": 6, "dm_heldout_ppl": 2, "dm_ruler_fwe": 1}
    assert 0.0 <= record["tasks"]["dm_lastword"]["acc"] <= 1.0
    assert record["tasks"]["dm_heldout_ppl"]["bits_per_byte"] > 0
