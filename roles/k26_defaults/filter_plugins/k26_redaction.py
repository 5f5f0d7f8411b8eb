"""A snapshot's env files without their secrets (`{{ text | k26_redact }}`): redacted by the name and by the value's
shape.
"""

from __future__ import annotations

import re


# A snapshot's env files are committed to git: each line NAME=VALUE keeps its name; its value is redacted when the
# name sounds secret or the value has a secret's shape (issue 48: redaction by name alone missed a token under a
# plain name). Shapes: a URL's user password, a password / token / key query parameter, a hub, cloud, chat or
# provider token's known prefix, and any long unbroken run of base64 or hex (32+ characters).
SECRET_NAME = re.compile(r"[A-Za-z0-9_]*(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|PRIVATE|DSN|COOKIE|SESSION)[A-Za-z0-9_]*",
                         re.IGNORECASE)
ENV_NAME_ANY = re.compile(r"(export\s+)?[A-Za-z_][A-Za-z0-9_]*")
SECRET_SHAPES = (
    (re.compile(r"(://[^:/@\s\"']*):[^@\s\"']*@"), r"\1:<redacted>@"),
    (re.compile(r"(?i)([?&;](?:password|passwd|pwd|token|access_token|api[_-]?key|secret|sig|signature)=)[^&;\s\"']+"),
     r"\1<redacted>"),
    (re.compile(r"\b(?:hf_|gh[pousr]_|github_pat_|glpat-|sk-|sk_live_|rk_live_|xox[abprs]-|AKIA|ASIA|AIza|ya29\.)"
                r"[A-Za-z0-9_\-.]{8,}"), "<redacted>"),
    # a long unbroken run with letters and digits, not a path's part (a release folder is named by a digest and the
    # restore needs PATH as it was): a key or token standing alone as the value or a parameter's value
    (re.compile(r"(?<![A-Za-z0-9+=_/.-])(?=[A-Za-z0-9+=_-]*[0-9])(?=[A-Za-z0-9+=_-]*[A-Za-z])[A-Za-z0-9+=_-]{32,}"
                r"(?![A-Za-z0-9+=_/.-])"), "<redacted>"),
)


def k26_redact(text) -> str:
    """TEXT (an env file) with every secret value replaced by <redacted>, by its name or by its shape."""
    out = []
    for line in str(text).splitlines(keepends=True):
        name, sep, value = line.partition("=")
        assignment = bool(sep) and ENV_NAME_ANY.fullmatch(name.strip()) is not None
        if assignment and SECRET_NAME.fullmatch(name.strip().split()[-1]):
            out.append(f"{name}=<redacted>" + ("\n" if line.endswith("\n") else ""))
            continue
        head, value = (name + "=", value) if assignment else ("", line)
        for pattern, replacement in SECRET_SHAPES:
            value = pattern.sub(replacement, value)
        out.append(head + value)
    return "".join(out)


class FilterModule:
    def filters(self):
        return {"k26_redact": k26_redact}
