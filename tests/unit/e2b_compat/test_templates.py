"""The E2B template -> execbox runtime mapping."""

from __future__ import annotations

import pytest

from execbox.service.e2b_compat.templates import TemplateRefused, runtime_for


class _Prov:
    def __init__(self, name: str, runtime: str = "") -> None:
        self.name, self.config = name, {"runtime": runtime}


@pytest.mark.parametrize("template", ["base", "code-interpreter-v1", "e2b/code-interpreter-v1:latest"])
def test_sdk_defaults_run_on_the_provider_default(template: str) -> None:
    assert runtime_for(template, _Prov("jail", "sci")) is None
    assert runtime_for(template, _Prov("docker")) is None


def test_jail_runtime_names(monkeypatch: pytest.MonkeyPatch) -> None:
    from execbox.boxes import runtime

    monkeypatch.setattr(runtime, "list_runtimes", lambda: [{"name": "system"}, {"name": "sci"}, {"name": "ml"}])
    assert runtime_for("sci", _Prov("jail", "sci")) is None  # what the provider runs anyway
    assert runtime_for("ml", _Prov("jail", "sci")) == "ml"  # another runtime template: the session's
    assert runtime_for("ml@v2", _Prov("jail", "sci")) == "ml@v2"
    with pytest.raises(TemplateRefused) as missing:
        runtime_for("nope", _Prov("jail", "sci"))
    assert missing.value.status == 404
    with pytest.raises(TemplateRefused):  # runtimes mean nothing to other providers
        runtime_for("sci", _Prov("docker"))
