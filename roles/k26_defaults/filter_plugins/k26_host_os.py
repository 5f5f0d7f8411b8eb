"""The one supported production OS and the refusal that names it (preflight's `os` entry point, every play's first
check of a host it connects to). `{{ os_release_text | k26_os_refusal(host) }}` -> '' or the refusal.
"""

from __future__ import annotations




# The one supported production OS (docs/operations.md, "Supported OS"): NVIDIA packages CUDA 13 and the R580 open kernel modules
# the RTX PRO 6000 needs for it, requirements/sglang.lock is resolved for its CPython 3.11, the monitoring packages
# are pinned to its archive's versions, and the sandbox runs it, so everything but the GPUs is tested on it here.
SUPPORTED_OS = {"ID": "debian", "VERSION_ID": "12", "name": "Debian 12 (bookworm)"}


def _os_release(text: str) -> dict[str, str]:
    """os-release(5) KEY=value lines (values optionally quoted) as a dict."""
    fields = {}
    for line in str(text).splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            fields[key] = value.strip().strip("'\"")
    return fields


def k26_os_refusal(os_release_text: str, host: str = "the host") -> str:
    """The refusal for a host whose /etc/os-release is not SUPPORTED_OS's, naming both; "" when it is."""
    fields = _os_release(os_release_text)
    if fields.get("ID") == SUPPORTED_OS["ID"] and fields.get("VERSION_ID") == SUPPORTED_OS["VERSION_ID"]:
        return ""
    found = fields.get("PRETTY_NAME") or " ".join(filter(None, (fields.get("ID"), fields.get("VERSION_ID")))) \
        or "an OS without /etc/os-release fields"
    return (f"{host} runs {found}; k26-ddtree supports {SUPPORTED_OS['name']} only (ID={SUPPORTED_OS['ID']}, "
            f"VERSION_ID={SUPPORTED_OS['VERSION_ID']} in /etc/os-release): its Python 3.11 is the one "
            "requirements/sglang.lock was resolved for and its archive has the pinned monitoring packages. "
            "Install Debian 12 on the host (docs/operations.md, \"Supported OS\")")


class FilterModule:
    def filters(self):
        return {"k26_os_refusal": k26_os_refusal}
