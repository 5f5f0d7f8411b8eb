"""Every operator-set variable's rule (the validators).

Preflight's input checks: every operator-set variable that reaches the unit, the env file or a
command, by type and pattern, each failure naming the variable, the value and the fix. The other
jobs live beside it, one module each: SGLang's argv (k26_sglang_args), systemd quoting
(k26_quoting), the OS (k26_host_os), the firewall's peers (k26_firewall), redaction
(k26_redaction), snapshot reading (k26_snapshot), the folders on the host (k26_folders), the rules
between settings (k26_relations) and YAML 1.1's traps (k26_yaml). (In roles/k26_defaults: every
role depends on it, so the filters are there for preflight's checks and the templates alike.)

`{{ values | k26_input_errors(spec) }}` -> a list of messages (empty when all pass). `values` maps a
variable name to its value (only variables the inventory, group vars or -e set; the roles' own
defaults are constants of this repository); `spec` is roles/preflight/vars/main.yml's
`_preflight_inputs` (kind and limits per variable).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping

# One word on a systemd command line or in an env file without quoting: no whitespace, quotes,
# backslashes, `$` (systemd expands it), `%` (specifiers), `;` or control characters.
SAFE_WORD = re.compile(r"[A-Za-z0-9._:/,=@+-]+")
PATH = re.compile(r"/[A-Za-z0-9._/+@-]*")
HOSTNAME = re.compile(r"(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
UNIX_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
VERSION = re.compile(r"[0-9]+(\.[0-9]+)*")
FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
ENV_VALUE = re.compile(r"[A-Za-z0-9._:/,=@+ -]*")
# the plugin's test-bed diagnostics (ddtree.sglang.diagnostics.step_dump): never on a served host
# the plugin's test-bed switches (ddtree.switches, test_bed_only;
# tests/unit/test_switches.py holds the two equal)
TEST_BED_ONLY = ("DDTREE_DEBUG", "SGLANG_DDTREE_DUMP", "SGLANG_DDTREE_DUMP_STEPS", "SGLANG_DDTREE_FAULT")
API_KEY = re.compile(r"[A-Za-z0-9._~+/=-]+")
URL = re.compile(r"https?://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(?P<port>[0-9]{1,5})")
# the NVIDIA device set only: char-nvidia* groups and /dev/nvidia* nodes (a disk or another device is refused, issue 48)
DEVICE = re.compile(r"(char-nvidia[a-z0-9_-]*|/dev/nvidia[A-Za-z0-9_-]*(/[A-Za-z0-9_-]+)*) [rwm]{1,3}")
PATH_LIKE = re.compile(r"/[A-Za-z0-9._/-]+")
APT_PIN = re.compile(r"[a-z0-9][a-z0-9+.-]*=[0-9][A-Za-z0-9.+:~-]*")
APT_WORD = re.compile(r"\.?/|[A-Za-z0-9][A-Za-z0-9._/-]*")   # a suite or component; a flat repository's ./
REPO_URI = re.compile(r"(https://|file:///)[A-Za-z0-9._~/:@%+-]+")
GIT_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
DURATION = re.compile(r"[1-9][0-9]{0,5}(ms|s|m|h|d|w|y)")          # a Prometheus duration, one unit
WEBHOOK = re.compile(r"https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?(/[A-Za-z0-9._~/%+=&?-]*)?")
BOOLS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
MAX_ARGS = 64
APT_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]{1,63}")
PERSISTENCED = re.compile(r"/usr/bin/nvidia-persistenced( --?[a-z][a-z0-9-]*(=[A-Za-z0-9._/-]+)?| [A-Za-z0-9._/-]+)*")


def _int(value, rule: Mapping) -> str | None:
    if isinstance(value, bool) or not re.fullmatch(r"[0-9]+", str(value).strip()):
        return f"expected an integer {_range(rule)}"
    number = int(str(value).strip())
    low, high = rule.get("min"), rule.get("max")
    if (low is not None and number < low) or (high is not None and number > high):
        return f"expected an integer {_range(rule)}"
    return None


def _schedule_pairs(value) -> list[tuple[int, int]] | None:
    """`32` or `1:64,8:32,32:8` -> [(from_batch, value), ...]; None when it is neither."""
    text = str(value).strip()
    if isinstance(value, bool):
        return None
    if re.fullmatch(r"[0-9]+", text):
        return [(1, int(text))]
    if not re.fullmatch(r"[0-9]+:[0-9]+(,[0-9]+:[0-9]+)*", text):
        return None
    return [(int(b), int(v)) for b, v in (part.split(":") for part in text.split(","))]


def _schedule(value, rule: Mapping) -> str | None:
    """One integer, or a schedule by running batch size (ddtree-serve's --speculative-ddtree-budget)."""
    expected = (f"expected an integer {_range(rule)} or BATCH:VALUE pairs by running batch size, the first at "
                f"batch 1 and the batches increasing, each value {_range(rule)} (e.g. 1:64,8:32,32:8)")
    pairs = _schedule_pairs(value)
    if pairs is None or pairs[0][0] != 1 or any(b2 <= b1 for (b1, _), (b2, _) in zip(pairs, pairs[1:])):
        return expected
    low, high = rule.get("min", 0), rule.get("max")
    if any(v < low or (high is not None and v > high) for _, v in pairs):
        return expected
    return None


AUTO_BUDGETS = (8, 16, 32)      # ddtree.settings.AUTO_BUDGETS (held equal by tests/ansible/test_schedule_rules.py)


def _auto_budgets(value) -> list[int] | None:
    """`auto` or `auto:8,16,32` -> the width policy's tree budgets (as written); None when it is not that form."""
    text = str(value).strip().lower()
    if isinstance(value, bool) or not re.fullmatch(r"auto(:[0-9]+(,[0-9]+)*)?", text):
        return None
    return list(AUTO_BUDGETS) if text == "auto" else [int(v) for v in text.split(":", 1)[1].split(",")]


def _budget(value, rule: Mapping) -> str | None:
    """A schedule (as _schedule), or the width policy: auto or auto:B1,B2,... (each budget in range, increasing;
    the SGLang plugin's `--speculative-ddtree-budget auto`, issue 70)."""
    if not str(value).strip().lower().startswith("auto") or isinstance(value, bool):
        error = _schedule(value, rule)
        return None if error is None else f"{error}; or auto (the width policy), e.g. auto:8,16,32"
    budgets = _auto_budgets(value)
    low, high = rule.get("min", 0), rule.get("max")
    if (budgets is None or any(b2 <= b1 for b1, b2 in zip(budgets, budgets[1:]))
            or any(b < low or (high is not None and b > high) for b in budgets)):
        return (f"expected auto (the budgets {','.join(map(str, AUTO_BUDGETS))}) or auto:B1,B2,... with each budget "
                f"{_range(rule)}, increasing, e.g. auto:8,16,32")
    return None


def k26_schedule_steps(budget, topk_cap, block_size=0) -> list[dict]:
    """At each batch size where the budget or the cap schedule changes: the two values and whether
    the rules between them hold there (cap <= budget; budget + 1 >= the draft's block). Both must
    have passed their rules. With auto, one row per tree budget (batch 1; each tree's cap is at most its budget, as
    the plugin makes it) and `auto_cap_schedule` where the cap is a schedule (auto keeps one cap)."""
    auto = _auto_budgets(budget)
    if auto is not None:
        c_pairs = _schedule_pairs(topk_cap)
        return [{"batch": 1, "budget": b, "topk_cap": min(c_pairs[0][1], b), "cap_over_budget": False,
                 "block_short": b + 1 < int(block_size or 0), "auto": True,
                 "auto_cap_schedule": len(c_pairs) > 1} for b in auto]
    b_pairs, c_pairs = _schedule_pairs(budget), _schedule_pairs(topk_cap)

    def at(pairs, batch):
        return [v for start, v in pairs if start <= batch][-1]

    out = []
    for batch in sorted({b for b, _ in b_pairs} | {b for b, _ in c_pairs}):
        b, c = at(b_pairs, batch), at(c_pairs, batch)
        out.append({"batch": batch, "budget": b, "topk_cap": c, "cap_over_budget": c > b,
                    "block_short": b + 1 < int(block_size or 0)})
    return out


def _range(rule: Mapping) -> str:
    return f"{rule.get('min', 0)}..{rule['max']}" if "max" in rule else f">= {rule.get('min', 0)}"


def _number(value, rule: Mapping) -> str | None:
    try:
        number = float(str(value).strip())
    except ValueError:
        number = None
    if isinstance(value, bool) or number is None or number != number:
        return f"expected a number {_range(rule)}"
    if number < rule.get("min", float("-inf")) or number > rule.get("max", float("inf")):
        return f"expected a number {_range(rule)}"
    return None


def _text(value, rule: Mapping) -> str | None:
    """Free text passed as one argument (never through a shell): printable, one line, bounded."""
    limit = rule.get("max_chars", 1000)
    if value == "" and rule.get("empty_ok"):
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > limit or not value.isprintable():
        return f"expected 1..{limit} printable characters on one line"
    return None


def _bool(value, rule: Mapping) -> str | None:
    if isinstance(value, bool) or str(value).strip().lower() in BOOLS:
        return None
    return "expected true or false"


# Folders of the system: the FHS top levels and their standard direct children. A folder the
# project owns (makes k26:k26, gives the unit ReadWritePaths, writes into) may be none of these
# nor a parent of one: `k26_state_dir: /var/lib` would hand /var/lib/dpkg to the service user.
SYSTEM_DIRS = frozenset({
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/lost+found",
    "/media", "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var",
    "/snap", "/nix",
    "/etc/systemd", "/etc/ssh", "/etc/sudoers.d", "/etc/apt", "/etc/default", "/etc/security", "/etc/pam.d",
    "/etc/ssl", "/etc/cron.d", "/etc/profile.d", "/etc/ld.so.conf.d", "/etc/modprobe.d", "/etc/sysctl.d",
    "/etc/udev", "/etc/opt", "/etc/alternatives", "/etc/init.d", "/etc/logrotate.d", "/etc/network",
    "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec", "/usr/include",
    "/usr/local", "/usr/share", "/usr/src", "/usr/games",
    "/usr/local/bin", "/usr/local/sbin", "/usr/local/lib", "/usr/local/share", "/usr/local/include",
    "/usr/local/etc", "/usr/local/src",
    "/var/lib", "/var/log", "/var/cache", "/var/spool", "/var/tmp", "/var/mail", "/var/opt", "/var/local",
    "/var/run", "/var/lock", "/var/backups", "/var/www", "/var/crash",
    "/run/systemd", "/run/user", "/run/lock", "/run/shm", "/dev/shm",
    "/var/lib/dpkg", "/var/lib/apt", "/var/lib/systemd", "/var/lib/private", "/var/cache/apt",
})
# World-writable or pseudo file systems: nothing of the project's may live under them (another
# user can create the folder first; /proc and /sys are the kernel's).
NO_OWNED_UNDER = ("/tmp", "/var/tmp", "/dev", "/proc", "/sys", "/run/user", "/run/shm")
PATH_FIX = "expected an absolute path of letters, digits and ._/+@- (no spaces, quotes, $ or %, no ..)"


def _path(value, rule: Mapping) -> str | None:
    text = str(value)
    if text == "" and rule.get("empty_ok"):
        return None
    if not PATH.fullmatch(text) or "/../" in text + "/" or len(text) > 4096:
        return PATH_FIX
    return _owned_path(text) if rule.get("owned") else None


def _owned_path(text: str) -> str | None:
    """A folder (or file) the project creates and owns: normalised, not a system folder, not a
    parent of one, not under a world-writable or pseudo file system, not someone's home."""
    if text != "/" and (text.endswith("/") or "//" in text or "/./" in text + "/"):
        return "expected a normalised path (no trailing /, no //, no /./)"
    if text in SYSTEM_DIRS or any(d.startswith(text.rstrip("/") + "/") for d in SYSTEM_DIRS):
        return ("is a system folder or a parent of one: the project would take it over (chown to the service user, "
                "ReadWritePaths); name a folder of the project's own below it, e.g. " + _own_example(text))
    if any(text == root or text.startswith(root + "/") for root in NO_OWNED_UNDER):
        return "is under a world-writable or pseudo file system (/tmp, /var/tmp, /dev, /proc, /sys): use /var/lib/... or /opt/..."
    if text.count("/") == 2 and text.startswith("/home/"):
        return "is a user's home folder: name a folder of the project's own below it"
    return None


def _own_example(text: str) -> str:
    base = {"/": "/opt", "/var": "/var/lib", "/usr": "/opt", "/etc": "/etc"}.get(text, text)
    return f"{base.rstrip('/')}/k26"


def _host(value, rule: Mapping) -> str | None:
    if not isinstance(value, str):      # YAML's yes, ~, 1.5 or 7: not what was meant (True would render as a name)
        return f"expected an address or DNS name as text, got {type(value).__name__} {value!r}: quote it"
    text = value
    try:
        ipaddress.ip_address(text)
        return None
    except ValueError:
        pass
    if HOSTNAME.fullmatch(text):
        return None
    return "expected an IPv4 or IPv6 address or a DNS name (no spaces, no flags)"


def _network(value, rule: Mapping) -> str | None:
    try:
        ipaddress.ip_network(str(value).strip(), strict=False)
        return None
    except ValueError:
        return "expected an IPv4 or IPv6 address or network (e.g. 10.0.0.0/24), not a name"


def _pattern(regex: re.Pattern, what: str) -> Callable:
    def check(value, rule: Mapping) -> str | None:
        if value == "" and rule.get("empty_ok"):
            return None
        return None if isinstance(value, str) and regex.fullmatch(value) else f"expected {what}"
    return check


def _choice(value, rule: Mapping) -> str | None:
    """One of `choices`; `lower: true` compares lower-cased text (YAML's true/false and 'true'/'false')."""
    choices = [str(c) for c in rule["choices"]]
    given = str(value).lower() if rule.get("lower") else value
    if given in choices:
        return None
    return "expected " + (" or ".join(choices) if len(choices) <= 2 else ", ".join(choices[:-1]) + " or " + choices[-1])


def _args(value, rule: Mapping) -> str | None:
    """A list of '--flag', '--flag value' or '--flag=value' items (one word of value each), none of
    them a flag the roles own (`refused`, `refused_prefixes`: the rule says which variable sets it)."""
    if not isinstance(value, list):
        return "expected a list of '--flag' or '--flag value' strings"
    if len(value) > MAX_ARGS:
        return f"expected at most {MAX_ARGS} items"
    for index, item in enumerate(value):
        if not isinstance(item, str):
            return f"item {index} ({item!r}) is not a string"
        flag, _, rest = item.partition("=") if "=" in item.split(" ", 1)[0] else item.partition(" ")
        if not FLAG.fullmatch(flag):
            return f"item {index} ({item!r}) does not start with a --flag of lower-case letters, digits and -"
        if rest and not SAFE_WORD.fullmatch(rest):
            return (f"item {index} ({item!r}): the value after the flag must be one word of letters, digits and "
                    "._:/,=@+- (no spaces, quotes, $, % or ;)")
        owner = _flag_owner(flag, rule)
        if owner:
            return f"item {index} ({item!r}): {flag} is set by the roles from {owner}, not through k26_extra_args"
    return None


def _flag_owner(flag: str, rule: Mapping) -> str | None:
    refused = rule.get("refused") or {}
    if flag in refused:
        return refused[flag]
    for prefix, owner in (rule.get("refused_prefixes") or {}).items():
        if flag.startswith(prefix):
            return owner
    return None


def _list(value, rule: Mapping) -> str | None:
    """A list of 1..max_items items (0.. with empty_ok), each passing the rule `item`."""
    if not isinstance(value, list) or (not value and not rule.get("empty_ok")):
        return "expected a list" if rule.get("empty_ok") else "expected a non-empty list"
    if len(value) > rule.get("max_items", 64):
        return f"expected at most {rule.get('max_items', 64)} items"
    item_rule = rule["item"]
    for index, item in enumerate(value):
        why = CHECKS[item_rule["kind"]](item, item_rule)
        if why:
            return f"item {index} ({'<not shown>' if rule.get('secret') else repr(item)}): {why}"
    return None


def _url(value, rule: Mapping) -> str | None:
    """http(s)://HOST:PORT with an address or DNS name and a port, nothing after it."""
    match = URL.fullmatch(str(value)) if isinstance(value, str) else None
    if match is None and not (value == "" and rule.get("empty_ok")):
        return "expected http://HOST:PORT or https://HOST:PORT (an address or DNS name, a port, no path)"
    if match and (_host(match["host"].strip("[]"), rule) or _int(match["port"], {"min": 1, "max": 65535})):
        return "expected http://HOST:PORT with a valid host and a port 1..65535"
    return None


# k26_service_env's names: an allow-list by name and library (the rule's `names`, roles/preflight/vars/main.yml); a
# name that loads code or redirects a loader or an interpreter is on no list, and is named as such: the unit's
# environment runs `--trust-remote-code` Python as the service user, so a name that loads a file is a way in (issues
# 48, 72)
ENV_LOADS_CODE = re.compile(r"LD_.*|PYTHON.*|.*(_PATH|_PRELOAD|_LIBRARY|_LIB|PLUGINS?|_PLUGIN_.*|_HOME|_DIR_OVERRIDE|"
                            r"_CACHE_MANAGER|_OVERRIDE_DIR|_MODULES_CACHE|_EXTENSIONS_DIR)")
ENV_OWN_VALUES = {"SGLANG_PLUGINS": "ddtree"}       # allowed with exactly this value (which plugins SGLang loads)


def _env_libraries(rule: Mapping) -> dict[str, str]:
    """name -> its library, from the rule's `names` (library -> names)."""
    return {name: library for library, names in (rule.get("names") or {}).items() for name in names}


def _env_name(name, rule: Mapping) -> str | None:
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        return f"name {name!r} is not an environment variable name (A-Z, 0-9, _)"
    if name in TEST_BED_ONLY:
        return (f"{name} is a GPU test bed diagnostic (a deliberate fault or a per-step dump: wrong or slow "
                "answers); remove it from k26_service_env")
    owner = (rule.get("owned") or {}).get(name)
    if owner:
        return f"{name} is set by the roles from {owner}; set that, not k26_service_env"
    if name in _env_libraries(rule):
        return None
    loads = (": it names a file or plugin the server would load (a path, a library, a module or a plugin)"
             if ENV_LOADS_CODE.fullmatch(name) else "")
    return (f"{name} is not an allowed name{loads}; k26_service_env takes the library settings listed in "
            f"roles/preflight/vars/main.yml (k26_service_env.names: {', '.join(rule.get('names') or {})}), "
            "each read by the pinned library")


def _env(value, rule: Mapping) -> str | None:
    """A map of allowed names (_env_name) to one-line values; messages name the variable, never its value (an env
    entry may hold a secret)."""
    if not isinstance(value, Mapping):
        return "expected a map of NAME: value"
    for name, item in value.items():
        why = _env_name(name, rule)
        if why:
            return why
        if isinstance(item, bool):      # YAML's yes/on/true: the env file would say True, which NCCL reads as 0
            return (f"{name}: a boolean ({item}) is written as {item} in the env file, which the libraries read as "
                    f"neither 1 nor 0 (NCCL takes it for 0): write the string the library expects, e.g. \"1\" or \"0\"")
        if not isinstance(item, str):   # YAML reads 010 as 8, 1e3 as 1000.0 and 1_000 as 1000: the text is what counts
            return (f"{name}: expected a string, got {type(item).__name__} (YAML reads 010 as 8 and 1e3 as 1000.0): "
                    "quote the value, e.g. \"8\"")
        if not ENV_VALUE.fullmatch(str(item)) or len(str(item)) > 1024:
            return f"{name}: its value (not shown) holds other than letters, digits, spaces and ._:/,=@+- (no quotes, $, newlines)"
        if name in ENV_OWN_VALUES and str(item) != ENV_OWN_VALUES[name]:
            return f"{name}: its value must be {ENV_OWN_VALUES[name]} (the plugin this project installs)"
    return None


def _api_key(value, rule: Mapping) -> str | None:
    """The characters only; empty, short and demo keys get their own messages (tasks/settings.yml)."""
    return None if isinstance(value, str) and (value == "" or API_KEY.fullmatch(value)) and len(value) <= 256 else \
        "expected up to 256 characters of letters, digits and ._~+/=- (e.g. `openssl rand -hex 24`)"


def _api_keys(value, rule: Mapping) -> str | None:
    """1..max_items distinct keys, each an api_key of at least 16 characters (no value is shown)."""
    if not isinstance(value, list) or not value or len(value) > rule.get("max_items", 4):
        return f"expected a list of 1 to {rule.get('max_items', 4)} keys"
    for index, item in enumerate(value):
        if not isinstance(item, str) or len(item) < 16 or _api_key(item, rule):
            return f"item {index}: expected a key of 16 to 256 characters of letters, digits and ._~+/=-"
    return "a key is listed twice" if len(set(value)) != len(value) else None


def _pem(value, rule: Mapping) -> str | None:
    """Empty (off), or PEM text holding one or more blocks of rule["pem"] (CERTIFICATE, or PRIVATE KEY for any key
    type); whether a certificate and a key belong together is checked on the gateway host (k26_gateway.py check)."""
    if value == "":
        return None
    label = rule.get("pem", "CERTIFICATE")
    blocks = re.findall(r"-----BEGIN ([A-Z ]+)-----\n[A-Za-z0-9+/=\n]+-----END \1-----", value) \
        if isinstance(value, str) else []
    if not blocks or not all(label in b for b in blocks) or len(value) > 65536:
        return f"expected PEM text of {label} blocks (-----BEGIN {label}-----...), or empty for no TLS"
    return None


def _apt_source(value, rule: Mapping) -> str | None:
    """{} or a deb822 source: name, uris (https:// or file:///), suites, components (words), signed_by
    (an absolute key path or an https URL), optional trusted (the sandbox's local repository only)."""
    if value == {}:
        return None
    if not isinstance(value, Mapping):
        return "expected a map of deb822 fields, or {}"
    unknown = sorted(set(value) - {"name", "uris", "suites", "components", "signed_by", "trusted"})
    if unknown:
        return f"{unknown[0]} is not one of name, uris, suites, components, signed_by, trusted"
    if not isinstance(value.get("name"), str) or not UNIX_NAME.fullmatch(value["name"]):
        return "name: expected a file name of a-z, 0-9, _ and -"
    uris = value.get("uris")
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) and REPO_URI.fullmatch(u) for u in uris):
        return "uris: expected a list of https:// or file:/// repository URLs"
    for field in ("suites", "components"):
        words = value.get(field, [])
        if not isinstance(words, list) or not all(isinstance(w, str) and APT_WORD.fullmatch(w) for w in words):
            return f"{field}: expected a list of words"
    if not value.get("suites"):
        return "suites: expected at least one suite (a flat repository's is ./)"
    key = value.get("signed_by", "")
    if not value.get("trusted") and not (isinstance(key, str) and (REPO_URI.fullmatch(key) or PATH_LIKE.fullmatch(key))):
        return "signed_by: expected the repository's key (an absolute path or an https URL)"
    return None


def _fixed(value, rule: Mapping) -> str | None:
    """A constant of this repository shown in argument_specs (the published demo keys, the entry points the wheel must
    register): not a setting, so any other value is refused (an empty demo-key list would let a demo key through).
    rule["values"] lists the values allowed when there is more than one (the sandbox's reference server)."""
    allowed = rule["values"] if "values" in rule else [rule["value"]]
    return None if value in allowed else "is a constant of this repository, not a setting (remove it)"


def _derived(value, rule: Mapping) -> str | None:
    """Computed by the roles from other settings (rule["from"]); given from outside it would replace that."""
    return f"is derived by the roles from {rule['from']}, not a setting (remove it from the inventory and -e)"


def _controller_path(value, rule: Mapping) -> str | None:
    """An absolute path on the controller (where this check runs); with exists: true it must be there now."""
    text = str(value)
    if text == "" and rule.get("empty_ok"):
        return None
    if not PATH.fullmatch(text):          # the roles' defaults go through role_path/../..: normalised here
        return PATH_FIX
    text = os.path.normpath(text)
    if rule.get("exists") and not os.path.exists(text):
        return "does not exist on the controller (the machine running ansible-playbook)"
    return None


def _regex(value, rule: Mapping) -> str | None:
    why = _text(value, {"max_chars": 200})
    if why:
        return why
    try:
        re.compile(value)
    except re.error as err:
        return f"is not a regular expression ({err})"
    return None


# accounts and groups a Debian 12 host has for other jobs: the service never runs as one nor takes one over
# (`k26_group: shadow` would give `--trust-remote-code` Python /etc/shadow; issue 48)
SYSTEM_ACCOUNTS = {"root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp", "proxy",
                   "www-data", "backup", "list", "irc", "gnats", "nobody", "nogroup", "_apt", "messagebus", "sshd",
                   "shadow", "sudo", "adm", "disk", "kmem", "tty", "dialout", "cdrom", "floppy", "tape", "audio",
                   "video", "render", "plugdev", "staff", "users", "src", "utmp", "operator", "input", "kvm", "netdev",
                   "docker", "lxd", "polkitd", "crontab", "ssh", "ssl-cert", "systemd-journal", "systemd-network",
                   "systemd-resolve", "systemd-timesync", "systemd-coredump", "nvidia-persistenced", "prometheus"}


def _service_account(value, rule: Mapping) -> str | None:
    why = CHECKS["unix_name"](value, rule)
    if why:
        return why
    if str(value) in SYSTEM_ACCOUNTS or str(value).startswith("systemd-"):
        return "is an account or group of the system: name one of the project's own (the default k26)"
    return None


MODEL_KEYS = {"name", "source", "dest", "digests"}


def _models(value, rule: Mapping) -> str | None:
    """playbooks/stage_models.yml's entries: name, source (https://, http:// or file:///), dest (a path), digests (a
    file on the controller); the role checks the folder's visibility to the unit and every digest line."""
    if not isinstance(value, list) or len(value) > 8:
        return "expected a list of at most 8 models"
    for index, entry in enumerate(value):
        if not isinstance(entry, Mapping) or set(entry) != MODEL_KEYS:
            return f"item {index}: expected exactly the keys {sorted(MODEL_KEYS)}"
        if MODEL_NAME.fullmatch(str(entry["name"])) is None:
            return f"item {index}: name {entry['name']!r}: expected letters, digits and ._:/-"
        if not re.fullmatch(r"https?://[A-Za-z0-9.\[\]:-]+(/[A-Za-z0-9._~/%+-]*)?|file:///[A-Za-z0-9._~/%+-]*",
                            str(entry["source"])):
            return (f"item {index}: source {shown(entry['source'])}: expected https://HOST[:PORT][/PATH], "
                    "http://HOST[:PORT][/PATH] or file:///PATH")
        for key, check, key_rule in (("dest", _path, {}), ("digests", _controller_path, {"exists": True})):
            why = check(entry[key], key_rule)
            if why:
                return f"item {index}: {key} {shown(entry[key])}: {why}"
    return None


CHECKS: dict[str, Callable] = {
    "int": _int, "number": _number, "text": _text, "bool": _bool, "path": _path, "host": _host, "network": _network,
    "choice": _choice, "args": _args, "env": _env,
    "schedule": _schedule, "budget": _budget, "api_key": _api_key, "api_keys": _api_keys, "list": _list, "url": _url,
    "device": _pattern(DEVICE, "a DeviceAllow entry of the NVIDIA set: char-nvidia... or /dev/nvidia..., then r, w and/or m"),
    "git_ref": _pattern(GIT_REF, "a tag name of letters, digits and ._- (starting with a letter or digit)"),
    "model_name": _pattern(MODEL_NAME, "1-128 characters of letters, digits and ._:/- starting with a letter or digit"),
    "unix_name": _pattern(UNIX_NAME, "a user or group name (a-z, 0-9, _ and -, starting with a letter or _)"),
    "version": _pattern(VERSION, "a version such as 580.0"),
    "apt_pin": _pattern(APT_PIN, "a package pinned as name=version, e.g. nvidia-open=580.95.05-1"),
    "apt_source": _apt_source, "pem": _pem,
    "duration": _pattern(DURATION, "a duration of one number and one unit (ms, s, m, h, d, w, y), e.g. 15s or 30d"),
    "webhook": _pattern(WEBHOOK, "an http(s) URL (http(s)://HOST[:PORT][/PATH], no spaces or quotes)"),
    "word": _pattern(SAFE_WORD, "one word of letters, digits and ._:/,=@+-"),
    "apt_name": _pattern(APT_NAME, "a Debian package name (a-z, 0-9 and +.-)"),
    "persistenced": _pattern(PERSISTENCED, "/usr/bin/nvidia-persistenced and its options, on one line"),
    "service_account": _service_account, "fixed": _fixed, "derived": _derived,
    "controller_path": _controller_path, "regex": _regex, "models": _models,
}


def shown(value) -> str:
    """The value as the operator wrote it; quoted (repr) when it holds spaces or other specials."""
    text = str(value) if isinstance(value, (int, str)) and SAFE_WORD.fullmatch(str(value)) else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def k26_input_errors(values: Mapping, spec: Mapping) -> list[str]:
    """One message per variable that fails its rule: 'NAME=VALUE is invalid: WHY; FIX'."""
    errors = []
    for name, rule in spec.items():
        if name not in values:
            continue
        kind = rule["kind"]
        if kind not in CHECKS:
            raise ValueError(f"_preflight_inputs: {name} has an unknown kind {kind!r} (known: {sorted(CHECKS)})")
        why = CHECKS[kind](values[name], rule)
        if why:
            value = "<not shown>" if rule.get("secret") else shown(values[name])
            errors.append(f"{name}={value} is invalid: {why}; {rule.get('fix', 'fix it in the inventory or the -e value')}")
    return errors


class FilterModule:
    def filters(self):
        return {"k26_input_errors": k26_input_errors, "k26_schedule_steps": k26_schedule_steps}
