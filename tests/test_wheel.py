"""`pip install .` (not editable) must carry the Hydra config tree: the console scripts compose from it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(out)], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "TMPDIR": str(build)})
    assert done.returncode == 0, done.stderr[-2000:]
    return next(out.glob("kernelzero-*.whl"))


def test_the_wheel_carries_every_config_of_conf(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    shipped = {n.split("/share/kernelzero/", 1)[1] for n in names if "/share/kernelzero/conf/" in n}
    expected = {str(p.relative_to(REPO)) for p in (REPO / "conf").rglob("*.yaml")}
    assert expected and shipped == expected, sorted(expected ^ shipped)
    assert any(n.startswith("core/") for n in names) and any(n.startswith("plugins/") for n in names)


def test_an_installed_package_finds_the_config_tree_where_the_wheel_put_it(tmp_path, monkeypatch):
    import sysconfig

    from core.config import conf_dir

    installed = tmp_path / "prefix" / "share" / "kernelzero" / "conf"
    installed.mkdir(parents=True)
    (installed / "config.yaml").write_text("defaults: []\n")
    paths = dict(sysconfig.get_paths())
    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: {**paths, "data": str(tmp_path / "prefix")})
    assert conf_dir(source=str(tmp_path / "no-source-tree")) == str(installed)
    assert conf_dir() == str(REPO / "conf")  # a source tree (or an editable install) uses its own
