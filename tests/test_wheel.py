"""`pip install .` (not editable) must carry the Hydra config tree: the console scripts compose from it, in a
fresh environment without the source tree, from any directory (about 10 s; an e2e test, tests/conftest.py)."""

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


def _fresh_venv(where: Path) -> Path:
    """A new virtual environment that sees this one's dependencies (torch, hydra ...) but not the
    source tree: a .pth line adds .venv's site-packages as a plain path, so the editable install's own
    .pth (which points at the checkout) is never processed there."""
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    ask = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(where / "bin" / "python"), "-c", ask], check=True, capture_output=True,
                               text=True).stdout.strip())
    (site / "kernelzero_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return where / "bin" / "python"


def test_the_installed_wheel_runs_selfplay_from_another_directory(wheel, tmp_path):
    python = _fresh_venv(tmp_path / "venv")
    # --ignore-installed: the dependencies' site-packages also holds this checkout's editable install, which
    # pip would otherwise take for the wheel (same version) and skip
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                           "--ignore-installed", str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    ask = "import core, core.config; print(core.__file__); print(core.config.conf_dir())"
    where = subprocess.run([str(python), "-c", ask], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr[-2000:]
    core_file, conf = where.stdout.split()
    assert str(tmp_path / "venv") in core_file and str(REPO) not in core_file, where.stdout + where.stderr
    assert conf.startswith(str(tmp_path / "venv")), conf

    run_dir = tmp_path / "run"
    proc = subprocess.run([str(tmp_path / "venv" / "bin" / "kernelzero"), "experiment=selfplay", "rounds=1",
                           "tasks_per_round=2", "device=cpu", f"hydra.run.dir={run_dir}"],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "pass rate" in proc.stdout
    assert (run_dir / "metrics.jsonl").read_text().strip()
