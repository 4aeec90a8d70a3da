"""deltamatch: a reproduction harness for *Delta-Matching: Closing the Final Gap of Native 8-bit Training for LLMs*.

Subpackages live in the project's top-level folders (see ``setup.py``):

- ``deltamatch.kernels``  -> ``kernels/``  FP8 attention numerics, Triton Hopper kernels, probes
- ``deltamatch.models``   -> ``models/``   hybrid LMs, data, trainer, publishing
- ``deltamatch.evals``    -> ``evals/``    lm-eval adapter and suites
- ``deltamatch.reports``  -> ``reports/``  tables, figures and the report
"""

__version__ = "0.1.0"
