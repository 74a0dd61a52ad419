"""The integrations document every parameter of their public callables (the check of tests/test_param_docs.py, run
here, where the conftest lets Lightning and accelerate import next to a CPU torch)."""

from __future__ import annotations

import pytest

from tests.conftest import installed
from tests.test_param_docs import undocumented


@pytest.mark.parametrize(("module_name", "needs"), [("lossscale.torch.integrations.accelerate", "accelerate"),
                                                    ("lossscale.torch.integrations.lightning", "lightning")])
def test_every_parameter_of_the_integrations_is_documented(module_name, needs):
    if not installed(needs):
        pytest.skip(f"{module_name} needs {needs}")
    assert undocumented(module_name) == []
