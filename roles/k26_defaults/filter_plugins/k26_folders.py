"""The folders the project owns, judged on the host (preflight's folders.yml): another program's folder named by
mistake (`k26_foreign_folders`), and a writable folder nesting with a tree root runs from (`k26_nested_trees`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping


# Folder trees root runs programs or reads its configuration from: a folder the service user writes to may not be
# inside one (it would change what root runs), nor hold one (issue 48: k26_state_dir under dist-packages, k26_prefix
# under the state folder)
ROOT_TREES = ("/usr", "/etc", "/boot", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


# What the roles write into each folder the project owns: an existing folder holding one of these (with root or the
# service user as its owner) is already the project's (issue 48); so is an empty one, and the state folder when the
# service user owns it. Anything else is another program's folder named by mistake.
FOLDER_SIGNS = {
    "k26_prefix": ("releases", "current", "wheelhouse", "venv", "wheels", "requirements.txt"),
    "k26_state_dir": ("cache", "gpu-host-report.json"),
    "k26_config_dir": ("k26-ddtree.env", "k26-ddtree.yaml", "gpu-host.env"),
    "k26_rollback_dir": ("state", "k26-ddtree.service", "k26-ddtree.env", "sweep-original", "validate-original",
                         "before-snapshot-rollback", "sweep-in-progress", "validate-in-progress",
                         "validate-prompts.json"),
    # a gateway host's (the gateway role: smg's venvs, the tool, the pool record; its file, worker key and TLS pair)
    "k26_gateway_prefix": ("venv", "bin", "state", "wheelhouse"),
    "k26_gateway_config_dir": ("gateway.yaml", "worker.key", "tls"),
}
FOLDER_DEFAULTS = {"k26_prefix": "/opt/k26", "k26_state_dir": "/var/lib/k26", "k26_config_dir": "/etc/k26",
                   "k26_rollback_dir": "/var/lib/k26-rollback", "k26_gateway_prefix": "/opt/k26-gateway",
                   "k26_gateway_config_dir": "/etc/k26-gateway"}


def _foreign_folder(name: str, stat: Mapping, entries: list[str], service_user: str) -> str | None:
    """Why the folder NAME points at (its stat, its top-level entries) is not the project's, or None."""
    if not stat.get("exists"):
        return None
    path, owner = stat.get("path", "?"), stat.get("pw_name", "?")
    if not stat.get("isdir"):
        return f"{name}={path} exists and is not a folder"
    if not entries:
        return None
    if owner in ("root", service_user) and (
            set(entries) & set(FOLDER_SIGNS.get(name, ())) or (name == "k26_state_dir" and owner == service_user)):
        return None
    shown = ", ".join(sorted(entries)[:5]) + (", ..." if len(entries) > 5 else "")
    count = f"{len(entries)} " + ("entry" if len(entries) == 1 else "entries")
    return (f"{name}={path} is a folder of this host that is not the project's (owner {owner}, {count}: {shown}): the deploy would give it to the service user or write into it. Name a new folder "
            f"(the default {FOLDER_DEFAULTS.get(name, 'of the role')}), or empty this one first")


def k26_foreign_folders(stats: list, listings: list, service_user: str) -> list[str]:
    """One message per folder the project owns that exists and is not the project's. STATS: a looped stat's results
    over {name: path} items; LISTINGS: a looped find's results over those stat results (existing folders only)."""
    entries = {r["item"]["item"]["key"]: [os.path.basename(f["path"]) for f in r.get("files", [])]
               for r in listings if not r.get("skipped")}
    messages = []
    for result in stats:
        name = result["item"]["key"]
        why = _foreign_folder(name, result.get("stat", {}), entries.get(name, []), str(service_user))
        if why and why not in messages:
            messages.append(why)
    return messages


def k26_nested_trees(writable: str, root_owned: list) -> list[str]:
    """The folders of ROOT_TREES + root_owned that `writable` lies inside of or holds (equal counts as both)."""
    def inside(a: str, b: str) -> bool:
        return (a.rstrip("/") + "/").startswith(b.rstrip("/") + "/")
    w = str(writable)
    return [t for t in (*ROOT_TREES, *(str(x) for x in root_owned if x)) if inside(w, t) or inside(t, w)]


class FilterModule:
    def filters(self):
        return {"k26_foreign_folders": k26_foreign_folders, "k26_nested_trees": k26_nested_trees}
