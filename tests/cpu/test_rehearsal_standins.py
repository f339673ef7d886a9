"""The rehearsal's seam and builder: settings that refuse a real trn2 host, fake nodes, neuron-ls, the wheels.

rehearsal/settings.py is the one place the rehearsal changes what the suite sees of the host
(recipes/platform/neuron.py ``device_nodes`` reads it when ``QWEN3_REHEARSAL_SETTINGS`` is set);
``python -m rehearsal.standins build`` writes the stand-in wheels offline. The cpu tier never
imports a stand-in package: this module reads the wheels as zip files.
"""

from __future__ import annotations

import email
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from recipes.platform import neuron, neuron_versions, nkilib_source
from recipes.tiers import REPO_ROOT

SETTINGS_FILE = REPO_ROOT / "rehearsal" / "settings.py"


@pytest.fixture(scope="module")
def settings_module():
    """rehearsal/settings.py loaded by path, as recipes/platform/neuron.py loads it."""
    spec = importlib.util.spec_from_file_location("_test_rehearsal_settings", SETTINGS_FILE)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def write_settings(tmp_path: Path, **fields) -> Path:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"device_dir": str(tmp_path / "dev"), **fields}))
    return path


def test_settings_refuse_a_host_with_a_real_neuron_device(tmp_path, settings_module):
    real = tmp_path / "realdev"
    real.mkdir()
    path = write_settings(tmp_path)
    assert settings_module.load(path, real_glob=str(real / "neuron[0-9]*")).ranks == 2
    (real / "neuron0").touch()
    with pytest.raises(settings_module.RehearsalSettingsError, match="real Neuron devices"):
        settings_module.load(path, real_glob=str(real / "neuron[0-9]*"))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"rank": 2}, "unknown keys \\['rank'\\]"),
        ({"lnc": 3}, "lnc=3 must be 1 or 2"),
        ({"ranks": 0}, "ranks=0 must be a positive integer"),
        ({"switches": {"QWEN3_STANDIN_AUTOLOAD": "yes"}}, "must be the strings '0' or '1'"),
        ({"fault": "rope"}, "fault='rope' is not one of"),
    ],
)
def test_bad_settings_name_the_key(tmp_path, settings_module, fields, message):
    with pytest.raises(settings_module.RehearsalSettingsError, match=message):
        settings_module.load(write_settings(tmp_path, **fields), real_glob=str(tmp_path / "none*"))


def test_device_nodes_come_from_the_settings_only_when_named(tmp_path, monkeypatch):
    """The seam: the suite's own detection sees the rehearsal's nodes; hidden (the cpu tier) it sees none."""
    path = write_settings(tmp_path, neuron_devices=3)
    monkeypatch.setenv(neuron.REHEARSAL_SETTINGS_ENV, str(path))
    assert (
        neuron.device_nodes() == []
    )  # the cpu tier's conftest hides devices, and that comes first
    monkeypatch.delenv(neuron.HIDE_DEVICES_ENV)
    assert neuron.device_nodes() == [str(tmp_path / "dev" / f"neuron{i}") for i in range(3)]
    assert neuron.neuron_status().devices == neuron.device_nodes()


def test_the_rehearsed_trn2_tier_takes_the_seams_ranks_and_tiny_sizes(tmp_path):
    """Under the seam the night's launches run at its rank count on the fixture-sized models (the MoE at the
    smallest hidden size nkilib's MoE kernels take, a launch that pins its sequence length at the seam's);
    without it, the trn2 tier is the real one."""
    code = (
        "import json; from recipes.tiers import TRN2; from harness.night import plan as nightly; from recipes import nki_moe; "
        "opts = nightly.LAUNCHES['config3-as_published'].options(); "
        "rope_hf = nightly.LAUNCHES['config3-rope_hf']; "
        "print(json.dumps([TRN2.nproc, TRN2.full_size_models, TRN2.seq_len, opts.nproc, "
        "nki_moe.moe_dims('trn2', 4, 64, 4).hidden_size, rope_hf.seq_len, rope_hf.options().seq_len]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "QWEN3_REHEARSAL_SETTINGS"}
    seen = {}
    for name, extra in (
        ("real", {}),
        ("rehearsed", {"QWEN3_REHEARSAL_SETTINGS": str(write_settings(tmp_path, ranks=2))}),
    ):
        out = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO_ROOT,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        seen[name] = json.loads(out.stdout.splitlines()[-1])
    assert seen == {
        "real": [64, True, 2048, 64, 2048, 2048, 2048],
        "rehearsed": [2, False, 256, 2, 512, 2048, 256],
    }


def test_standin_neuron_ls_counts_the_settings_cores(tmp_path):
    """``neuron-ls -j`` as the stand-in prints it is what recipes/platform/neuron.py counts: devices x cores."""
    path = write_settings(tmp_path, neuron_devices=2, cores_per_device=4, lnc=2)
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "rehearsal" / "standins" / "neuron_ls.py"), "-j"],
        env={"QWEN3_REHEARSAL_SETTINGS": str(path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    devices = json.loads(out.stdout)
    assert [d["neuroncore_ids"] for d in devices] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert neuron.logical_core_count(devices, lnc=2) == 8
    assert neuron.logical_core_count(devices, lnc=1) == 16


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("standins")
    subprocess.run(
        [sys.executable, "-m", "rehearsal.standins", "build", "--out", str(out)],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return out


def _metadata(wheel: Path) -> tuple[email.message.Message, list[str], str]:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        entry = next((n for n in names if n.endswith(".dist-info/entry_points.txt")), None)
        return (
            email.message_from_bytes(z.read(info)),
            names,
            z.read(entry).decode() if entry else "",
        )


@pytest.mark.slow  # builds three wheels with pip (about 6 s)
def test_builder_writes_the_pinned_distributions_and_neuron_ls(built):
    pins = neuron_versions.pins()
    wheels = sorted((built / "wheelhouse").glob("*.whl"))
    found = {
        neuron_versions.normalize(_metadata(w)[0]["Name"]): _metadata(w)[0]["Version"]
        for w in wheels
    }
    assert set(found) == {"torch-neuronx", "neuronx-cc", "nki"}
    for name, version in found.items():
        assert neuron_versions.Expected(name, pins[name]).matches(version), (
            name,
            version,
            pins[name],
        )
    assert (built / "bin" / "neuron-ls").stat().st_mode & 0o111


@pytest.mark.slow  # builds three wheels with pip (about 6 s)
def test_neuronx_cc_owns_nkilib_and_torch_neuronx_autoloads(built):
    """What recipes/platform/nkilib_source.py and the autoload contract look for in the installed metadata."""
    _, cc_files, _ = _metadata(next((built / "wheelhouse").glob("neuronx_cc-*.whl")))
    for module in ("nkilib", *nkilib_source.KERNEL_MODULES):
        base = module.replace(".", "/")
        assert {f"{base}.py", f"{base}/__init__.py"} & set(cc_files), (
            f"{module} is not in the neuronx-cc stand-in wheel"
        )
    _, _, entry_points = _metadata(next((built / "wheelhouse").glob("torch_neuronx-*.whl")))
    assert "[torch.backends]" in entry_points


def test_no_standin_is_importable_from_a_checkout():
    """From the repository root (the cwd of every tier's process) no stand-in package resolves to rehearsal/:
    the hyphenated source directories are not packages, so only an installed wheel provides them."""
    code = (
        "import importlib.util, json; "
        "print(json.dumps({m: getattr(importlib.util.find_spec(m), 'origin', None) "
        "for m in ('torch_neuronx', 'torch_neuronx_autoload', 'nki', 'nkilib')}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    origins = {m: o and str(Path(o).resolve()) for m, o in json.loads(done.stdout).items()}
    assert not [o for o in origins.values() if o and o.startswith(str(REPO_ROOT / "rehearsal"))], (
        origins
    )
