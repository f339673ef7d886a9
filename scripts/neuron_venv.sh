#!/usr/bin/env bash
# Set up the trn2 tier (Neuron SDK 2.33) in one command: `make neuron-venv`.
#
#   scripts/neuron_venv.sh [--check] [--force]
#
# Creates $VENV (default .venv-neuron) with Python 3.12-3.14, installs requirements-neuron.txt,
# asks the TorchTitan Neuron repository whether its release ref exists (git ls-remote), clones
# that ref, installs it with `pip install -e .` and records ref and commit in
# $VENV/torchtitan-neuron.json (runs put it in their provenance, report and dry run).
# With NEURON_VENV=/path/to/venv (the Neuron DLAMI's /opt/aws_neuronx_venv_torch_neuronx_2_14_0)
# $VENV is layered on that prebuilt venv: its packages are visible, nothing is installed into it.
#   --check   print the plan after the OS, Python and ref checks (git ls-remote asks the remote
#             which ref it has); change nothing, download nothing else
#   --force   reinstall even when $VENV/.neuron-installed says the same inputs are installed
#
# Environment: PYTHON (python3), VENV (.venv-neuron), NEURON_VENV, TORCHTITAN_NEURON_URL,
# TORCHTITAN_NEURON_REF (a branch or tag of that repository), TORCHTITAN_NEURON_DIR
# ($VENV/src/torchtitan-neuron), OS_RELEASE (/etc/os-release); REHEARSAL_PYTHON_FLOOR (e.g. 3.11)
# is for `make rehearse-trn2` only: it lowers the Python floor, the one check the rehearsal
# overrides, and says so.
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
# - training/torchtitan/get-started/setup-torchtitan-neuron.rst: `git clone
#   https://github.com/aws-neuron/torchtitan-neuron.git` (the default branch; the page names no
#   release branch or tag); pip install -r requirements.txt; pip install -e .
#   Whether a release-2.33 ref exists is not documented: git ls-remote decides, and a missing
#   ref is an error naming the refs that do exist, never a silent fallback to the default branch.
#
# Layering on NEURON_VENV: `python -m venv --system-site-packages` made from a venv's python
# exposes the *base* interpreter's site-packages (pyvenv.cfg `home` is the base interpreter),
# not the prebuilt venv's. So $VENV also gets a .pth line that adds NEURON_VENV's site-packages
# (site.addsitedir, which also runs that directory's own .pth files) after $VENV's own: pip
# sees the DLAMI's packages as installed and installs only what differs into $VENV.
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
# Read by recipes/platform/torchtitan_checkout.py (same name there).
RECORD_NAME=torchtitan-neuron.json
LAYER_PTH=_neuron_venv_base.pth

CHECK=0
FORCE=0

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

# Which ref TORCHTITAN_NEURON_REF is on the remote: sets REF_KIND (branch|tag) and REF_COMMIT.
# Refuses a ref that is missing or both a branch and a tag, listing what the remote has.
resolve_ref() {
  local refs heads tag peeled
  echo "+ git ls-remote --heads --tags $TORCHTITAN_NEURON_URL"
  refs="$(git ls-remote --heads --tags "$TORCHTITAN_NEURON_URL")" \
    || die "git ls-remote $TORCHTITAN_NEURON_URL failed (network, or not a git repository); nothing was installed"
  heads="$(awk -v r="refs/heads/$TORCHTITAN_NEURON_REF" '$2 == r {print $1}' <<<"$refs")"
  tag="$(awk -v r="refs/tags/$TORCHTITAN_NEURON_REF" '$2 == r {print $1}' <<<"$refs")"
  peeled="$(awk -v r="refs/tags/$TORCHTITAN_NEURON_REF^{}" '$2 == r {print $1}' <<<"$refs")"
  if [ -n "$heads" ] && [ -n "$tag" ]; then
    die "$TORCHTITAN_NEURON_URL has both a branch and a tag named '$TORCHTITAN_NEURON_REF' (git ls-remote):" \
        "ambiguous, so nothing was installed; set TORCHTITAN_NEURON_REF to a name that is only one of them"
  elif [ -n "$heads" ]; then
    REF_KIND=branch REF_COMMIT="$heads"
  elif [ -n "$tag" ]; then
    REF_KIND=tag REF_COMMIT="${peeled:-$tag}"
  else
    local available
    available="$(awk '{print $2}' <<<"$refs" | grep -v '\^{}$' | sed -e 's#^refs/heads/#branch #' -e 's#^refs/tags/#tag #' \
                 | { grep -i -E 'release|main|master|2\.3' || true; } | head -20 | paste -sd, - | sed 's/,/, /g')"
    die "$TORCHTITAN_NEURON_URL has no branch or tag '$TORCHTITAN_NEURON_REF' (git ls-remote; it has: ${available:-no release, main or 2.3x refs})." \
        "Set TORCHTITAN_NEURON_REF to one that exists: the Neuron setup page clones the default branch," \
        "which this script never takes in place of a missing release ref by itself"
  fi
  say "TorchTitan Neuron: $REF_KIND $TORCHTITAN_NEURON_REF at $REF_COMMIT ($TORCHTITAN_NEURON_URL)"
}

# The inputs that decide the install; a matching stamp makes a rerun a no-op.
stamp_text() {
  printf 'requirements %s\nurl %s\nref %s\ncommit %s\nneuron_venv %s\n' \
    "$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)" "$TORCHTITAN_NEURON_URL" "$TORCHTITAN_NEURON_REF" \
    "$REF_COMMIT" "$NEURON_VENV"
}

# $VENV on top of the prebuilt $1 (Python $2): its own venv, the prebuilt site-packages after its own.
layer_venv() {
  local base="$1" version="$2"
  local base_site="$base/lib/python$version/site-packages" site="$VENV/lib/python$version/site-packages"
  [ -d "$base_site" ] || die "NEURON_VENV=$base has no $base_site; point it at the Neuron DLAMI venv (e.g. $DLAMI_VENV)"
  run "$base/bin/python" -m venv --system-site-packages "$VENV"
  echo "+ echo \"import site; site.addsitedir('$base_site')\" > $site/$LAYER_PTH"
  if [ "$CHECK" = 0 ]; then
    echo "import site; site.addsitedir('$base_site')" > "$site/$LAYER_PTH"
  fi
}

# $VENV/torchtitan-neuron.json: what recipes/platform/torchtitan_checkout.py reads back.
record_checkout() {
  local checkout="$1" commit="$2"
  cat > "$VENV/$RECORD_NAME" <<EOF
{"url": "$TORCHTITAN_NEURON_URL", "ref": "$TORCHTITAN_NEURON_REF", "ref_kind": "$REF_KIND",
 "ls_remote_commit": "$REF_COMMIT", "commit": "$commit", "checkout": "$checkout",
 "recorded_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"}
EOF
}

main() {
  for arg in "$@"; do
    case "$arg" in
      --check) CHECK=1 ;;
      --force) FORCE=1 ;;
      -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
      *) echo "neuron-venv: unknown argument '$arg'; use --check, --force or --help" >&2; exit 2 ;;
    esac
  done

  if [ -n "${REHEARSAL_PYTHON_FLOOR:-}" ]; then
    [[ "$REHEARSAL_PYTHON_FLOOR" =~ ^3\.[0-9]+$ ]] \
      || die "REHEARSAL_PYTHON_FLOOR='$REHEARSAL_PYTHON_FLOOR' is not a Python 3.N version; unset it outside a rehearsal"
    echo "rehearsal: Python floor $MIN_PY overridden to $REHEARSAL_PYTHON_FLOOR"
    MIN_PY="$REHEARSAL_PYTHON_FLOOR"
  fi

  local os version
  os="$(host_os)"
  say "host OS: $os (from $OS_RELEASE)"

  if [ -n "$NEURON_VENV" ]; then
    [ -x "$NEURON_VENV/bin/python" ] \
      || die "NEURON_VENV=$NEURON_VENV has no bin/python; point it at the Neuron DLAMI venv (e.g. $DLAMI_VENV)"
    version="$(python_version_of "$NEURON_VENV/bin/python")"
    say "layering $VENV on the prebuilt venv NEURON_VENV=$NEURON_VENV (Python $version); nothing is installed into it"
    if [ -L "$VENV" ]; then
      die "$VENV is a link to $(readlink "$VENV") (an older neuron_venv.sh installed into that shared venv);" \
          "remove the link (rm $VENV) and rerun: $VENV is now its own venv layered on NEURON_VENV"
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

  resolve_ref

  local checkout="${TORCHTITAN_NEURON_DIR:-$VENV/src/torchtitan-neuron}"
  if [ "$CHECK" = 0 ] && [ "$FORCE" = 0 ] && [ -f "$VENV/.neuron-installed" ] \
     && [ "$(cat "$VENV/.neuron-installed")" = "$(stamp_text)" ]; then
    say "$VENV is up to date (same requirements-neuron.txt, TorchTitan Neuron $TORCHTITAN_NEURON_REF at $REF_COMMIT); --force reinstalls"
    exit 0
  fi

  [ "$CHECK" = 1 ] && say "plan (--check: nothing is changed or downloaded):"

  if [ -x "$VENV/bin/python" ]; then
    say "keeping the existing venv $VENV"
  elif [ -n "$NEURON_VENV" ]; then
    layer_venv "$NEURON_VENV" "$version"
  else
    run "$PYTHON" -m venv "$VENV"
  fi

  local pip=("$VENV/bin/python" -m pip)
  run "${pip[@]}" install --upgrade pip
  run "${pip[@]}" install -r "$REQUIREMENTS"

  if [ -d "$checkout/.git" ]; then
    local origin
    origin="$(git -C "$checkout" remote get-url origin)"
    [ "$origin" = "$TORCHTITAN_NEURON_URL" ] \
      || die "$checkout is a clone of $origin, not $TORCHTITAN_NEURON_URL; remove it or set TORCHTITAN_NEURON_DIR"
    run git -C "$checkout" fetch --depth 1 origin "$TORCHTITAN_NEURON_REF"
    run git -C "$checkout" checkout --detach FETCH_HEAD
  else
    run git clone --depth 1 --branch "$TORCHTITAN_NEURON_REF" "$TORCHTITAN_NEURON_URL" "$checkout"
  fi
  # The fork's own dependencies, then the fork itself (the distribution 'torchtitan').
  # Pip may not move the Neuron pins: requirements-neuron.txt is passed again as constraints.
  run "${pip[@]}" install -r "$checkout/requirements.txt" -c "$REQUIREMENTS"
  run "${pip[@]}" install -e "$checkout" -c "$REQUIREMENTS"

  if [ "$CHECK" = 1 ]; then
    say "would record $TORCHTITAN_NEURON_REF ($REF_KIND) and the checked-out commit in $VENV/$RECORD_NAME"
    say "plan complete; run without --check to do it"
    exit 0
  fi
  local commit
  commit="$(git -C "$checkout" rev-parse HEAD)"
  if [ "$commit" != "$REF_COMMIT" ]; then
    say "warning: $TORCHTITAN_NEURON_REF moved since git ls-remote ($REF_COMMIT); installed $commit, recorded as such"
  fi
  record_checkout "$(cd "$checkout" && pwd)" "$commit"
  stamp_text > "$VENV/.neuron-installed"
  say "done: $VENV (TorchTitan Neuron $REF_KIND $TORCHTITAN_NEURON_REF at $commit, recorded in $VENV/$RECORD_NAME)"
  say "run the trn2 tier with: make test-neuron"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
