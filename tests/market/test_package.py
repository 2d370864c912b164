"""``market`` must import without Django: ``market.mechanism`` is used by non-Django code."""

import subprocess
import sys

from tests.conftest import REPO_ROOT


def test_market_package_imports_without_django() -> None:
    code = (
        "import sys, market\n"
        "loaded = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.'))\n"
        "assert not loaded, loaded\n"
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
