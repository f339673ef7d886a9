#!/usr/bin/env bash
# Set up the trn2 tier (Neuron SDK 2.33) in one command: `make neuron-venv`.
#
#   scripts/neuron_venv.sh [--check] [--force]
#
# Creates $VENV (default .venv-neuron) with Python 3.12-3.14, installs requirements-neuron.txt,
# clones TorchTitan Neuron at its release ref and installs it with `pip install -e .`.
# With NEURON_VENV=/path/to/venv it reuses a prebuilt venv instead (the Neuron DLAMI's
# /opt/aws_neuronx_venv_torch_neuronx_2_14_0) and links $VENV to it.
#   --check   print the plan after the OS and Python checks; change nothing, download nothing
#   --force   reinstall even when $VENV/.neuron-installed says the same inputs are installed
#
# Environment: PYTHON (python3), VENV (.venv-neuron), NEURON_VENV, TORCHTITAN_NEURON_URL,
# TORCHTITAN_NEURON_REF (a branch or tag), TORCHTITAN_NEURON_DIR ($VENV/src/torchtitan-neuron),
# OS_RELEASE (/etc/os-release).
#
# Sources (aws-neuron/aws-neuron-sdk docs, Neuron 2.33):
# - torch/get-started/quickstart-torch-neuron.rst (v2.33.1): "The standalone wheels in this release
#   support Ubuntu 26.04 only"; on Ubuntu 24.04 use the TorchNeuron single-framework DLAMI, on
#   22.04/24.04 otherwise build torch-neuronx from source.
# - setup/pytorch/update-dlami.rst (v2.33.0): the "Deep Learning AMI Neuron torch-neuronx 2.14.0"
#   DLAMI (Ubuntu 24.04 and 26.04; no Ubuntu 22.04 DLAMI) has its venv in
#   /opt/aws_neuronx_venv_torch_neuronx_2_14_0.
# - setup/pytorch/update-manual.rst (v2.33.0): pip with the Neuron index and the PyTorch CPU index
#   (both are in requirements-neuron.txt).
# - release-notes/components/torchtitan-neuron.rst: TorchTitan Neuron 0.2.2+neuron.1 on
#   torch-neuronx 2.14.3.0.*, Python 3.12, 3.13 and 3.14.
# - training/torchtitan/get-started/setup-torchtitan-neuron.rst: git clone
#   https://github.com/aws-neuron/torchtitan-neuron.git; pip install -r requirements.txt; pip install -e .
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQUIREMENTS="$ROOT/requirements-neuron.txt"
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-$ROOT/.venv-neuron}"
NEURON_VENV="${NEURON_VENV:-}"
# Defaults repeated from recipes/platform/neuron_versions.py (tests/cpu/test_neuron_install.py checks they agree).
TORCHTITAN_NEURON_URL="${TORCHTITAN_NEURON_URL:-https://github.com/aws-neuron/torchtitan-neuron.git}"
TORCHTITAN_NEURON_REF="${TORCHTITAN_NEURON_REF:-release-2.33}"
OS_RELEASE="${OS_RELEASE:-/etc/os-release}"
DLAMI_VENV=/opt/aws_neuronx_venv_torch_neuronx_2_14_0
MIN_PY=3.12
MAX_PY=3.14

CHECK=0
FORCE=0
for arg in "$@"; do
  case "$arg" in
    --check) CHECK=1 ;;
    --force) FORCE=1 ;;
    -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "neuron-venv: unknown argument '$arg'; use --check, --force or --help" >&2; exit 2 ;;
  esac
done

say() { echo "neuron-venv: $*"; }
die() { echo "neuron-venv: error: $*" >&2; exit 1; }
# Print a command, then run it (or only print it under --check).
run() { echo "+ $*"; if [ "$CHECK" = 0 ]; then "$@"; fi; }

# The host OS from os-release, e.g. "ubuntu 24.04"; "unknown" when the file is absent.
host_os() {
  if [ ! -r "$OS_RELEASE" ]; then echo "unknown"; return; fi
  ( . "$OS_RELEASE"; echo "${ID:-unknown} ${VERSION_ID:-unknown}" )
}

# "3.12" from an interpreter; refuses versions outside 3.12-3.14.
python_version_of() {
  local exe="$1" version
  version="$("$exe" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" \
    || die "cannot run '$exe'; set PYTHON to a Python $MIN_PY-$MAX_PY interpreter"
  [[ "$version" =~ ^[0-9]+\.[0-9]+$ ]] || die "'$exe' reports Python version '$version'; set PYTHON to a Python $MIN_PY-$MAX_PY interpreter"
  local major="${version%%.*}" minor="${version#*.}"
  if [ "$major" != 3 ] || [ "$minor" -lt "${MIN_PY#3.}" ] || [ "$minor" -gt "${MAX_PY#3.}" ]; then
    die "'$exe' is Python $version; TorchTitan Neuron 0.2.2+neuron.1 (torch-neuronx 2.14.3.0) supports" \
        "Python 3.12, 3.13 and 3.14. Install one (e.g. apt-get install python3.12-venv) and rerun with" \
        "PYTHON=python3.12, or reuse the Neuron DLAMI venv with NEURON_VENV=$DLAMI_VENV"
  fi
  echo "$version"
}

# The inputs that decide the install; a matching stamp makes a rerun a no-op.
stamp_text() {
  printf 'requirements %s\nurl %s\nref %s\nneuron_venv %s\n' \
    "$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)" "$TORCHTITAN_NEURON_URL" "$TORCHTITAN_NEURON_REF" "$NEURON_VENV"
}

os="$(host_os)"
say "host OS: $os (from $OS_RELEASE)"

if [ -n "$NEURON_VENV" ]; then
  [ -x "$NEURON_VENV/bin/python" ] \
    || die "NEURON_VENV=$NEURON_VENV has no bin/python; point it at the Neuron DLAMI venv (e.g. $DLAMI_VENV)"
  version="$(python_version_of "$NEURON_VENV/bin/python")"
  say "reusing the prebuilt venv NEURON_VENV=$NEURON_VENV (Python $version)"
  if [ -e "$VENV" ] && [ ! -L "$VENV" ]; then
    die "$VENV exists and is not a link to NEURON_VENV; remove it or unset NEURON_VENV"
  fi
else
  if [ "$os" != "ubuntu 26.04" ]; then
    die "this host is '$os': the Neuron 2.33 standalone torch-neuronx wheels install on Ubuntu 26.04 only." \
        "On the TorchNeuron DLAMI (Ubuntu 24.04/26.04) reuse its prebuilt venv:" \
        "NEURON_VENV=$DLAMI_VENV make neuron-venv (or a venv where you built torch-neuronx 2.14 from source)"
  fi
  version="$(python_version_of "$PYTHON")"
  say "creating a venv with $PYTHON (Python $version)"
fi

CHECKOUT="${TORCHTITAN_NEURON_DIR:-$VENV/src/torchtitan-neuron}"
if [ "$CHECK" = 0 ] && [ "$FORCE" = 0 ] && [ -f "$VENV/.neuron-installed" ] \
   && [ "$(cat "$VENV/.neuron-installed")" = "$(stamp_text)" ]; then
  say "$VENV is up to date (same requirements-neuron.txt, TorchTitan Neuron $TORCHTITAN_NEURON_REF); --force reinstalls"
  exit 0
fi

[ "$CHECK" = 1 ] && say "plan (--check: nothing is changed or downloaded):"

if [ -n "$NEURON_VENV" ]; then
  [ -L "$VENV" ] && [ "$(readlink "$VENV")" = "$NEURON_VENV" ] || run ln -sfn "$NEURON_VENV" "$VENV"
elif [ -x "$VENV/bin/python" ]; then
  say "keeping the existing venv $VENV"
else
  run "$PYTHON" -m venv "$VENV"
fi

PIP=("$VENV/bin/python" -m pip)
[ -n "$NEURON_VENV" ] || run "${PIP[@]}" install --upgrade pip
run "${PIP[@]}" install -r "$REQUIREMENTS"

if [ -d "$CHECKOUT/.git" ]; then
  origin="$(git -C "$CHECKOUT" remote get-url origin)"
  [ "$origin" = "$TORCHTITAN_NEURON_URL" ] \
    || die "$CHECKOUT is a clone of $origin, not $TORCHTITAN_NEURON_URL; remove it or set TORCHTITAN_NEURON_DIR"
  run git -C "$CHECKOUT" fetch --depth 1 origin "$TORCHTITAN_NEURON_REF"
  run git -C "$CHECKOUT" checkout --detach FETCH_HEAD
else
  run git clone --depth 1 --branch "$TORCHTITAN_NEURON_REF" "$TORCHTITAN_NEURON_URL" "$CHECKOUT"
fi
# The fork's own dependencies, then the fork itself (the distribution 'torchtitan').
# Pip may not move the Neuron pins: requirements-neuron.txt is passed again as constraints.
run "${PIP[@]}" install -r "$CHECKOUT/requirements.txt" -c "$REQUIREMENTS"
run "${PIP[@]}" install -e "$CHECKOUT" -c "$REQUIREMENTS"

if [ "$CHECK" = 1 ]; then
  say "plan complete; run without --check to do it"
  exit 0
fi
stamp_text > "$VENV/.neuron-installed"
say "done: $VENV (torchtitan-neuron $TORCHTITAN_NEURON_REF at $(git -C "$CHECKOUT" rev-parse --short HEAD))"
say "run the trn2 tier with: make test-neuron"
