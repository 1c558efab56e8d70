"""The package's public names are importable from its top, lazily."""

from __future__ import annotations

import subprocess
import sys

import dlrover


def test_every_public_name_is_the_object_its_module_defines():
    import importlib

    for name in dlrover.__all__:
        module = importlib.import_module(dlrover._EXPORTS[name])  # noqa: SLF001 - the test reads the table it checks
        assert getattr(dlrover, name) is getattr(module, name), name


def test_an_unknown_name_is_an_attribute_error():
    try:
        dlrover.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("no AttributeError")


def test_importing_the_package_loads_neither_torch_nor_ray():
    code = "import sys, dlrover; print(sorted(m for m in ('torch', 'ray') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
