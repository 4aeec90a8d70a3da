"""The suite's xdist scheduling (tests/xdist_groups.py) on a small suite run by pytest itself with two workers: the
tests of a shared session fixture run on one worker (the fixture is built once), every other file stays on one worker,
and both workers get work."""

import json
from pathlib import Path

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent


def test_shared_fixture_tests_share_a_worker_and_files_stay_together(pytester):
    pytester.makeconftest(f"""
import json, os, sys
import pytest
sys.path.insert(0, {str(TESTS)!r})
import xdist_groups
from xdist_groups import pytest_configure_node, pytest_unconfigure, pytest_xdist_make_scheduler

def pytest_collection_modifyitems(config, items):
    xdist_groups.write_groups(config, items)

@pytest.fixture(scope="session")
def pipeline():
    with open("builds.txt", "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

@pytest.fixture(autouse=True)
def record(request):
    with open("ran.jsonl", "a") as f:
        f.write(json.dumps([request.node.nodeid, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")
""")
    shared = "def test_{0}(pipeline):\n    pass\n"
    plain = "def test_{0}():\n    pass\n"
    for name, body in (("test_a", plain), ("test_b", shared), ("test_c", plain), ("test_d", shared),
                       ("test_e", plain)):
        pytester.makepyfile(**{name: "".join(body.format(i) for i in range(4))})
    result = pytester.runpytest_subprocess("-p", "xdist", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=20)
    ran = [json.loads(line) for line in Path(pytester.path, "ran.jsonl").read_text().splitlines()]
    workers = {}
    for nodeid, worker in ran:
        group = "pipeline" if nodeid.split("::")[0] in ("test_b.py", "test_d.py") else nodeid.split("::")[0]
        workers.setdefault(group, set()).add(worker)
    assert all(len(w) == 1 for w in workers.values()), workers
    assert Path(pytester.path, "builds.txt").read_text().split() == list(workers["pipeline"])
    assert set().union(*workers.values()) == {"gw0", "gw1"}, workers
