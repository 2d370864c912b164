"""The SGLang plugin's tests run in their own venv (``make test-sglang``), where SGLang 0.5.23
is installed; the main suite's venv has no SGLang, and there these files are not collected
(not skipped: nothing here can run without SGLang, and the Makefile runs them in their stage).

SGLang reads most of its settings from a published ``ServerArgs``; a scheduler process
publishes one at start, and so does the ``sglang_runtime`` fixture, once per session, with the
ranks a single-GPU scheduler has.
"""

from __future__ import annotations

import importlib.util
import logging

import pytest

if importlib.util.find_spec("sglang") is None:
    collect_ignore_glob = ["test_*.py", "helpers.py"]


def pytest_configure(config: pytest.Config) -> None:
    # Importing SGLang on a machine without a GPU warns about its GPU-only quantizations, and
    # its SWIG-built dependencies about their types: nothing the tests can act on.
    config.addinivalue_line("filterwarnings", "ignore:Only CUDA:UserWarning")
    config.addinivalue_line("filterwarnings", "ignore:builtin type [Ss]wig:DeprecationWarning")


@pytest.fixture(scope="session", autouse=True)
def sglang_runtime():
    """Publish SGLang's default server args (as a scheduler process does) for the session."""
    from sglang.srt.runtime_context import get_context, get_parallel

    for name in ("sglang.srt.layers", "sglang.srt.configs", "sglang.srt.utils"):
        logging.getLogger(name).setLevel(logging.ERROR)
    override = get_context().override_server_args()
    override.install()
    get_parallel().override_permanently(tp_rank=0)
    yield
    get_parallel().clear_stamp()
    override.restore()
