"""The mechanism and the engine side import without Django (what ``.importlinter``'s
"Django-free" contract says of the source, checked here on what a fresh interpreter loads)."""

import subprocess
import sys

from tests.conftest import REPO_ROOT


def test_the_mechanism_and_the_engine_side_import_without_django() -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        "import mechanism, engines.contract, engines.client\n"
        "for package in (mechanism, engines.contract, engines.client):\n"
        "    for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "import engines.sim.server, engines.router\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'celery'))\n"
        "assert not loaded, loaded\n"
        "assert 'mechanism.reference' in sys.modules and 'engines.contract.wire' in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
