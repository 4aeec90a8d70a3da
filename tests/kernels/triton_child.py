"""Triton kernels in Triton's CPU interpreter, from a test.

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates a kernel, i.e. at import, so a test file runs its cases
in a child process started with it set: the file run as a script (``child_main``) prints one JSON object of
measurements, and the parent's ``measured`` fixture (``run_child``) parses it, so the assertions stay in the parent.
The child poisons ``torch.empty`` with NaN as tests/conftest.py does for in-process tests, so an output a kernel
leaves unwritten shows up as NaN.
"""

import json
import os
import subprocess
import sys


def run_child(script: str, timeout: int) -> dict:
    """Run ``script`` under the interpreter; its last stdout line, as JSON."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def child_main(measure) -> None:
    """In the child: poison ``torch.empty``, run ``measure()`` and print its result as one JSON line."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for poison.py
    from poison import poison_torch_empty  # conftest.py's fixture does not reach this child

    poison_torch_empty()
    print(json.dumps(measure()))


def patch_interpreter_index():
    """Triton 3.6's interpreter turns a 1-element array into a loop bound with ``int(array)``, which NumPy ≥ 2.4
    rejects for 1-d arrays; take the element instead (loop bounds that depend on ``tl.program_id``)."""
    import numpy as np
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched
