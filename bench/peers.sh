#!/bin/sh
# bench/peers.sh: the Python environment of the benchmark peers, in .cache/bench-venv (git-ignored,
# kept between runs; never the tests' .cache/venv). Not needed by `./remax run` or `./remax test`.
#
#   bench/peers.sh            make or update it; prints the python to use
#   bench/peers.sh torch V    the python of the torch peer V: 2 (this environment, made or updated
#                             first) or 1.13 (Debian's python3-torch, /usr/bin/python3); exit 3 with
#                             a "skipped" note when 1.13 is not installed, 2 for another V
#
# It holds torch 2.15.0 for the CPU (tests/torch_install.sh: the wheel without its ~3 GB of CUDA
# packages), then bench/requirements.txt: transformers, datasets, math-verify, and accelerate and
# trl with --no-deps (their other dependencies are listed there), because through a package that
# depends on torch pip would re-resolve torch's own dependencies and pull the CUDA packages.
#
# Users: bench/train_step.sh and bench/generate.sh (torch 2 beside Debian's python3-torch 1.13 at
# /usr/bin/python3, where that is installed: apt-get install python3-torch), bench/trl_peer.sh.
set -eu
cd "$(dirname "$0")/.."
if [ "${1:-}" = torch ]; then
  case ${2:-} in
    2) ;;   # this environment, below
    1.13)
      if /usr/bin/python3 -c "import torch" 2>/dev/null; then echo /usr/bin/python3; exit 0; fi
      echo "skipped: torch 1.13: Debian's python3-torch is not installed (apt-get install python3-torch)" >&2
      exit 3 ;;
    *) echo "bench/peers.sh torch ${2:-}: want 2 or 1.13" >&2; exit 2 ;;
  esac
fi
venv=.cache/bench-venv
py=$venv/bin/python
say() { echo "peers: $*" >&2; }
stamp=$(cat bench/requirements.txt bench/peers.sh tests/torch_install.sh | sha256sum | cut -c1-16)
if [ -f "$venv/peers.ok" ] && [ "$(cat "$venv/peers.ok")" = "$stamp" ] && [ -x "$py" ]; then
  echo "$py"
  exit 0
fi
mkdir -p .cache
t0=$(date +%s)
tests/torch_install.sh "$venv"
pip() { "$venv/bin/pip" --disable-pip-version-check -q "$@"; }
say "bench/requirements.txt"
deps=$(mktemp)
trap 'rm -f "$deps"' EXIT
grep -vE '^(accelerate|trl)==' bench/requirements.txt >"$deps"
pip install -r "$deps"
pip install --no-deps $(grep -oE '^(accelerate|trl)==[^ ]*' bench/requirements.txt)
"$py" -c "import torch, transformers, trl, math_verify, datasets" ||
  { say "the peers' packages do not import (above)"; exit 1; }
echo "$stamp" >"$venv/peers.ok"
say "ready in $(( $(date +%s) - t0 )) s: $("$py" -c 'import torch, transformers, trl; print("torch", torch.__version__, "transformers", transformers.__version__, "trl", trl.__version__)')"
echo "$py"
