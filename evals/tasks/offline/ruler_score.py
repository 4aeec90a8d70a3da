"""RULER scoring under one length-free metric name.

lm-eval's RULER ``process_results`` keys its score by the sample's ``max_length`` and pads the 4096 key with -1, so a
task only reports lengths its YAML lists. The offline suite runs RULER at whatever length suits the model, so it keys
the same score (lm-eval's own post-processing and ``string_match_all``) as ``score``.
"""

from lm_eval.tasks.ruler.common_utils import postprocess_pred, string_match_all


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    return {"score": string_match_all(postprocess_pred(results), [doc["outputs"]])}
