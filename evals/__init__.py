"""deltamatch.evals: everything that measures a checkpoint.

- ``dm-eval`` (:mod:`.cli`, :mod:`.runner`): one suite on one checkpoint through lm-eval, tidy JSON out.
- suites as YAML (:mod:`.suites`, ``suites/*.yaml``) and our own lm-eval task YAMLs (``tasks/``).
- :mod:`.adapter`: the checkpoint as an lm-eval model (``--model deltamatch``).
- :mod:`.offline_tasks`: the held-out last-word and perplexity data built from ``val_docs.jsonl``.
- :mod:`.preflight`: offline mode and the fail-fast check of what a suite would download.
- ``dm-probe`` (:mod:`.probe`): Table 9, the softmax-gradient residuals on real activations.
"""
