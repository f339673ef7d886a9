"""Stand-in ``neuron-ls`` (aws-neuronx-tools): ``neuron-ls -j`` prints the devices the rehearsal settings describe.

The JSON fields are those aws-neuron/aws-neuron-sdk tools/neuron-sys-tools/neuron-ls.rst documents
for ``-j`` (see ``RehearsalSettings.neuron_ls``). Without ``-j`` it prints one line per device.
Run as a script (``DIR/bin/neuron-ls`` execs it); it loads rehearsal/settings.py by path, so it needs
nothing on sys.path, and refuses on a host with real Neuron devices as ``settings.load`` does.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path


def _settings_module():
    path = Path(__file__).resolve().parent.parent / "settings.py"
    spec = importlib.util.spec_from_file_location("_rehearsal_settings", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    settings = _settings_module()
    try:
        devices = settings.load().neuron_ls()
    except settings.RehearsalSettingsError as e:
        print(f"neuron-ls (rehearsal stand-in): {e}", file=sys.stderr)
        return 1
    if "-j" in argv or "--json-output" in argv:
        print(json.dumps(devices, indent=2))
        return 0
    for d in devices:
        print(
            f"{d['neuron_device']:>3}  cores {d['nc_count']}  lnc {d['logical_neuroncore_config']}  (rehearsal stand-in)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
