"""Which xdist worker runs which test: every test that takes one of the expensive shared fixtures runs on one worker,
so the fixture is built once (the SLURM cluster, a singleton, is started once); every other test stays with its file,
so module fixtures are built once too. The shared groups go first: they are the longest.

pytest-xdist's own ``--dist loadgroup`` cannot do this under pytest 9.2: it passes a test's group to the controller by
appending it to the node id, and pytest 9.2's structured node ids ignore the write, so the groups are silently dropped
(pytest-dev/pytest-xdist#1386, open). Here each worker writes the groups it collected to a file the controller named
(``workerinput``), and the controller's scheduler, xdist's per-scope scheduler with this scope, reads them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

SHARED_FIXTURES = ("slurm", "pipeline", "tiny_run")
"""Session fixtures that build something expensive, longest first."""
INPUT_KEY = "deltamatch_groups_file"


def group_of(item) -> str:
    """A test's group: the first shared fixture it takes (directly or through other fixtures), else its file."""
    shared = [name for name in SHARED_FIXTURES if name in getattr(item, "fixturenames", ())]
    return shared[0] if shared else item.nodeid.split("::")[0]


def write_groups(config, items) -> None:
    """In a worker: the groups of its collection, to the file the controller named (one file per worker, renamed into
    place whole)."""
    path = getattr(config, "workerinput", {}).get(INPUT_KEY)
    if not path:
        return
    target = Path(f"{path}.{config.workerinput['workerid']}")
    tmp = target.with_name(f"tmp.{target.name}")
    tmp.write_text(json.dumps({item.nodeid: group_of(item) for item in items}))
    os.replace(tmp, target)


def groups_file(config) -> str:
    """In the controller: the path prefix the workers write to (a fresh folder per session)."""
    if not hasattr(config, "_deltamatch_groups"):
        config._deltamatch_groups = os.path.join(tempfile.mkdtemp(prefix="deltamatch_xdist_"), "groups")
    return config._deltamatch_groups


# The hooks, imported into tests/conftest.py (a conftest's hooks are the names in its namespace); the conftest's
# pytest_collection_modifyitems calls write_groups.
@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput[INPUT_KEY] = groups_file(node.config)


def pytest_unconfigure(config):
    """The controller's folder of group files goes with its session."""
    if hasattr(config, "_deltamatch_groups"):
        shutil.rmtree(os.path.dirname(config._deltamatch_groups), ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return make_scheduler(config, log) if config.getvalue("dist") == "loadgroup" else None


def make_scheduler(config, log):
    """xdist's per-scope scheduler with a test's scope its group, the shared groups handed out first."""
    from xdist.scheduler import LoadScopeScheduling

    prefix = groups_file(config)

    class FixtureGroupScheduling(LoadScopeScheduling):
        _groups: dict[str, str] | None = None
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                folder = Path(prefix).parent
                found = sorted(folder.glob(Path(prefix).name + ".gw*"))
                self._groups = json.loads(found[0].read_text()) if found else {}
            return self._groups.get(nodeid) or nodeid.split("::")[0]

        def _assign_work_unit(self, node) -> None:
            if not self._ordered:  # the shared groups first, in SHARED_FIXTURES' order; the rest as collected
                self._ordered = True
                rank = {name: i for i, name in enumerate(SHARED_FIXTURES)}
                for scope in sorted(self.workqueue, key=lambda s: rank.get(s, len(rank))):
                    self.workqueue.move_to_end(scope)
            super()._assign_work_unit(node)

    return FixtureGroupScheduling(config, log)
