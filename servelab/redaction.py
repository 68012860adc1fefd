"""The redaction rule: what servelab never writes or prints, and how it is hidden (docs/output.md#redaction).

Hidden, everywhere a command line, an environment, a URL or a server's answer is recorded (summary.json,
records.jsonl, cell.json, the store, report.html) or printed:

- the value of a command-line flag whose name has a secret word in it (`--api-key`, `--admin-api-key`,
  `--api-keys`, `--openai-api-key`, `--key`, `--hf-token`, `--bearer-token`, `--auth`, `--password`, ...; the
  words are in `SECRET_FLAG_WORDS`), and of the short flag `-k`; as `--flag VALUE` or `--flag=VALUE`. A flag
  that only switches something (`--disable-auth`, `--no-api-key`) or is followed by another flag hides nothing;
- the value of an environment variable whose name looks secret (`HF_TOKEN`, `OPENAI_API_KEY`, `DB_PASSWD`,
  `GH_PAT`, `MY_PAT`, ...), also in `NAME=VALUE` words of a command line;
- the user and password of a URL (`http://user:secret@host` -> `http://***@host`), in any value, argument or
  recorded URL;
- values shaped like well-known API keys (`sk-…`, `hf_…`, `ghp_…`, `github_pat_…`, `glpat-…`, `xox?-…`,
  `AKIA…`) wherever they appear in a command line or environment;
- in what a server answered (error details, response excerpts), the API key servelab sent, and any
  `Bearer …` token.

A hidden value becomes `***`. The rule errs on the side of hiding: a non-secret value under a secret-looking name
is hidden too, and provenance says so by the `***`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

REDACTED = "***"

# Environment variable names: a secret word anywhere in the name (substring), or PAT as a whole word (GH_PAT,
# MY_PAT; a substring PAT would hide PATH and PYTHONPATH).
_SECRET_ENV = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASS|AUTH|CREDENTIAL|BEARER|COOKIE|(?:^|_)PAT(?:_|$)",
                         re.IGNORECASE)
# Flag names are split into words on - and _: a flag is secret when one of its words is one of these.
SECRET_FLAG_WORDS = frozenset({
    "key", "keys", "apikey", "apikeys", "token", "secret", "secrets", "password", "passwd", "pass", "pwd", "auth",
    "credential", "credentials", "bearer", "pat", "cookie",
})
# Flags that are secret whatever their words say (short forms).
SECRET_SHORT_FLAGS = frozenset({"-k"})
# A first word that makes a flag a switch, not a setting with a value: --disable-auth, --no-api-key.
_SWITCH_WORDS = frozenset({"no", "disable", "enable", "allow", "require", "skip", "use", "with", "without"})
# Kept for callers that name the classic flags; the rule is the words above.
SECRET_FLAGS = frozenset({
    "--api-key", "--token", "--hf-token", "--password", "--auth-token", "--access-token", "--secret",
    "--ssl-keyfile-password", "--admin-api-key", "--api-keys", "--openai-api-key", "--key", "--bearer-token",
    "--auth", "-k",
})
_ENV_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
# scheme://user[:password]@ : the user-info part of a URL, wherever it appears in a text.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/\s@?#\"'<>]+)@")
# Well-known API key shapes (OpenAI, Hugging Face, GitHub, GitLab, Slack, AWS access key ids).
_KEY_SHAPES = re.compile(
    r"\b(?:sk-[A-Za-z0-9_\-]{16,}|hf_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_\-]{16,}|xox[abposr]-[A-Za-z0-9\-]{10,}|AKIA[0-9A-Z]{16})")
_BEARER = re.compile(r"(?P<word>\bBearer\s+)[A-Za-z0-9._~+/=\-]{4,}", re.IGNORECASE)


def is_secret_key(name: str) -> bool:
    """Whether an environment variable's value is hidden: HF_TOKEN, OPENAI_API_KEY, DB_PASSWD, GH_PAT, ..."""
    return bool(_SECRET_ENV.search(name))


def is_secret_flag(flag: str) -> bool:
    """Whether a command-line flag's value is hidden: --api-key, --admin-api-key, --key, --auth, -k, ..."""
    if flag in SECRET_SHORT_FLAGS:
        return True
    if not flag.startswith("--"):
        return False
    words = [w for w in re.split(r"[-_]", flag[2:].lower()) if w]
    if not words or words[0] in _SWITCH_WORDS:
        return False
    return any(w in SECRET_FLAG_WORDS for w in words)


def redact_url(text: str | None) -> str | None:
    """`text` with the user and password of every URL in it replaced: `http://u:p@h` -> `http://***@h`."""
    if not text or "@" not in text:
        return text
    return _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)


def redact_value(text: str) -> str:
    """A non-secret value as recorded: URL credentials and key-shaped words hidden."""
    text = redact_url(text) or text
    return _KEY_SHAPES.sub(REDACTED, text)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Copy of `env` with the values of secret-looking keys (HF_TOKEN, OPENAI_API_KEY, GH_PAT, ...) replaced by ***,
    and credentials inside the other values (HTTP_PROXY=http://u:secret@proxy) hidden."""
    return {key: (REDACTED if is_secret_key(key) else redact_value(value)) for key, value in env.items()}


def redact_command(argv: Sequence[str]) -> list[str]:
    """Copy of `argv` with secret flag values replaced (`--api-key X`, `--api-key=X`, `-k X`), `env HF_TOKEN=X`
    words hidden, and URL credentials and key-shaped words hidden in every other argument."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            hide_next = False
            if not (arg.startswith("-") and len(arg) > 1 and not arg[1:2].isdigit()):
                out.append(REDACTED)
                continue
            # a flag right after a secret-looking one: that one was a switch; look at this one afresh
        flag, eq, _value = arg.partition("=")
        if arg.startswith("-") and is_secret_flag(flag.lower()):
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        assignment = _ENV_ASSIGNMENT.match(arg)
        if assignment and not arg.startswith("-") and is_secret_key(assignment.group(1)):
            out.append(f"{assignment.group(1)}={REDACTED}")
            continue
        out.append(redact_value(arg))
    return out


def redact_text(text: str | None, secrets: Iterable[str | None] = ()) -> str | None:
    """What a server said, safe to record and print: each of `secrets` (the API key servelab sent) replaced
    wherever it appears, `Bearer …` tokens and URL credentials hidden."""
    if not text:
        return text
    for secret in secrets:
        if secret and len(secret) >= 4 and secret in text:
            text = text.replace(secret, REDACTED)
    if "earer" in text or "EARER" in text:
        text = _BEARER.sub(lambda m: f"{m.group('word')}{REDACTED}", text)
    return redact_url(text)
