"""Credential-shaped values in text: what they look like and what they are bound to, never the values themselves.

A rendered job script or manifest is read by everyone who can list the scheduler's jobs, copied into logs and kept
with the run, so no credential may be written into one. ``find(text)`` reports each credential-shaped value in a
string: tokens whose shape alone gives them away (GitHub, Slack, Hugging Face, GitLab, OpenAI-style, Google and AWS
key ids, JSON Web Tokens, private key headers), URLs with a password, Azure storage keys and signatures, and long
random-looking values assigned to a name that says it holds one (``export HF_TOKEN=…``, ``--password=…``,
``api_key: …``). A ``Finding`` says what it found and shows a redacted form; ``redact(text)`` hides every finding
in a message. Pure functions over strings: no I/O.

What the renderers legitimately write is left alone: paths, object-store URIs without a password, image digests
(``@sha256:…``), hashes bound to names that hold no secret, ``$VAR``/``${VAR}``/``$(VAR)`` references, and
references to Kubernetes Secrets by name.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["Finding", "find", "is_secret_name", "redact"]


@dataclass(frozen=True)
class Finding:
    kind: str                      # what it looks like, e.g. "a GitHub token"
    redacted: str                  # enough to recognise it by, never the value (see _redacted)
    name: str | None = None        # the variable, option or key it is assigned to, when it is assigned
    value: str = field(default="", repr=False)  # the credential itself: to find where it came from, never to print

    def describe(self) -> str:
        return f"{self.kind} ({self.redacted})" + (f" assigned to {self.name}" if self.name else "")


# Tokens recognisable by their shape alone: (what it is, pattern). Where a prefix alone could begin an ordinary
# word ("sk-", "hf_" and "gh?_" begin option and directory names too), the part after it, (?P<random>…), must mix
# cases or letters and digits, as generated tokens do.
_TOKENS = [
    ("a private key (PEM)", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")),
    ("an AWS access key id", re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])")),
    ("a GitHub token", re.compile(r"(?<![A-Za-z0-9_])(?:gh[pousr]_|github_pat_)(?P<random>[A-Za-z0-9_]{30,})")),
    ("a GitLab token", re.compile(r"(?<![\w-])glpat-(?P<random>[A-Za-z0-9_-]{20,})")),
    ("a Slack token", re.compile(r"(?<![\w-])xox[abpr]-(?P<random>[A-Za-z0-9-]{10,})")),
    ("a Slack webhook URL", re.compile(r"https://hooks\.slack\.com/services/[A-Za-z0-9/]+")),
    ("a Hugging Face token", re.compile(r"(?<![A-Za-z0-9_])hf_(?P<random>[A-Za-z0-9]{30,})")),
    ("an OpenAI-style API key", re.compile(r"(?<![\w-])sk-(?:proj-|ant-)?(?P<random>[A-Za-z0-9_-]{20,})")),
    ("a Google API key", re.compile(r"(?<![\w-])AIza[0-9A-Za-z_-]{35}(?![\w-])")),
    ("a JSON Web Token", re.compile(r"(?<![\w-])eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}")),
]
# scheme://user:password@host; the user may be empty (redis://:password@host)
_URL_WITH_PASSWORD = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<user>[^\s:/@'\"]*):"
                                r"(?P<password>[^\s/@'\"]+)@(?P<host>[^\s/'\"?#]+)")
# Azure storage connection strings (AccountKey=…;) and shared access signatures (…?sv=…&sig=…)
_AZURE = re.compile(r"(?:(?<![\w-])(?P<name>AccountKey|SharedAccessKey|SharedAccessSignature)=|[?&](?P<sig>sig)=)"
                    r"(?P<value>[^;&\s'\"]+)")

# Assignments, in the forms that job scripts, manifests and YAML use: NAME=value (shell, --option=value, URL query),
# name: value (YAML, JSON) and --option value (command lines).
_VALUE = r"(?P<value>'[^'\n]*'|\"[^\"\n]*\"|[^\s'\";&|,)}]+)"
_ASSIGNMENTS = [
    re.compile(r"(?<![\w.$-])(?P<name>-{0,2}[A-Za-z_][\w.-]*)=" + _VALUE),
    re.compile(r"(?<![\w.-])[\"']?(?P<name>[A-Za-z_][\w.-]*)[\"']?:[ \t]+" + _VALUE),
    re.compile(r"(?<![\w-])(?P<name>--?[A-Za-z][\w.-]*)[ \t]+(?=[^\s-])" + _VALUE),
]
# Words of a name that say its value is a credential: HF_TOKEN, --password, apiKey, AccountKey, X-Auth-Token.
_SECRET_WORDS = {"KEY", "KEYS", "TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASSPHRASE",
                 "CREDENTIAL", "CREDENTIALS", "AUTH", "APIKEY", "ACCESSKEY", "SECRETKEY", "PRIVATEKEY"}
_SECRET_ENDINGS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD")   # HFTOKEN, DBPASSWORD
_PASSWORD_WORDS = ("PASSWORD", "PASSWD", "PASSPHRASE")  # PGPASSWORD, --db-password
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")  # camelCase and snake_case both split into words

# Random-looking: at least 20 characters with a Shannon entropy near that of random text of its length. Random
# alphanumeric or base64 text of n characters carries close to log2(n) bits per character (4.1 at 20, 4.6 at 40);
# hyphenated words, paths and identifiers of the same length stay at 3.3-3.9 and rarely mix cases and digits.
# Hex carries at most 4 bits: a random hex string of 20+ characters has more than 3 (detect-secrets' limit).
_MIN_LENGTH = 20
_MAX_BITS_NEEDED = 4.0
_MIN_BITS_HEX = 3.0
_HEX = re.compile(r"^[0-9a-fA-F]+$")
_AWS_SECRET = re.compile(r"^[A-Za-z0-9/+]{40}$")
_NOT_A_CREDENTIAL = [
    re.compile(r"^\$"),                                   # $VAR, ${VAR}, $(VAR), $(cat file): read when the job runs
    re.compile(r"^(?:/|~/|\./|\.\./)"),                   # a path
    re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^@\s]*$"),  # a URI without user information
    re.compile(r"@sha256:[0-9a-f]{64}$"),                 # an image by digest
    re.compile(r"^(?:true|false|yes|no|on|off|null|none|-?[0-9.]+)$", re.IGNORECASE),
]


def find(text: str) -> list[Finding]:
    """Every credential-shaped value in ``text``, in order; each value once."""
    assignments = list(_assignments(text))
    # (priority, start, end, finding): where findings overlap, the most specific one is reported: a recognised
    # token (also as a URL's password) before a URL with a password before a random value assigned to a name
    candidates = []
    for kind, pattern in _TOKENS:
        for match in pattern.finditer(text):
            if "random" in pattern.groupindex and not _looks_random(match.group("random")):
                continue
            candidates.append((0, *match.span(), _finding(kind, match.group(0), _name_at(assignments, match.span()))))
    for match in _URL_WITH_PASSWORD.finditer(text):
        if not match.group("password").startswith("$"):
            redacted = f"{match.group('scheme')}://…@{match.group('host')}"  # user and password both hidden
            candidates.append((1, *match.span(), Finding("a URL with a password", redacted,
                                                         _name_at(assignments, match.span()), match.group(0))))
    for match in _AZURE.finditer(text):
        if not match.group("value").startswith("$"):
            candidates.append((0, *match.span("value"), _finding(
                "an Azure storage key" if match.group("name") else "an Azure shared access signature",
                match.group("value"), match.group("name") or match.group("sig"))))
    for name, value, start, end in assignments:
        kind = _assigned_credential(name, value)
        if kind:
            candidates.append((2, start, end, _finding(kind, value, name)))
    findings, taken = [], []
    for _, start, end, finding in sorted(candidates, key=lambda c: (c[0], c[1])):
        if any(start < other_end and other_start < end for other_start, other_end in taken):
            continue
        taken.append((start, end))
        findings.append((start, finding))
    unique = {}
    for _, finding in sorted(findings, key=lambda f: f[0]):
        unique.setdefault(finding.value, finding)
    return list(unique.values())


def redact(text: str) -> str:
    """``text`` with every credential found in it replaced by its redacted form (for error messages)."""
    for finding in find(text):
        text = text.replace(finding.value, finding.redacted)
    return text


def is_secret_name(name: str) -> bool:
    """Whether a variable, option or key name says its value is a credential (HF_TOKEN, --password, apiKey).
    Whole words only: TOKENIZERS_PARALLELISM and --tokenizer hold none."""
    words = _words(name)
    return bool(words & _SECRET_WORDS) or any(word.endswith(_SECRET_ENDINGS) for word in words)


def _words(name: str) -> set[str]:
    return {word.upper() for part in re.split(r"[^A-Za-z0-9]+", name) for word in _WORD.findall(part)}


def _assignments(text: str):
    """(name, value without quotes, start, end of the value) of every assignment in the text."""
    for pattern in _ASSIGNMENTS:
        for match in pattern.finditer(text):
            value, (start, end) = match.group("value"), match.span("value")
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value, start, end = value[1:-1], start + 1, end - 1
            yield match.group("name"), value, start, end


def _name_at(assignments, span: tuple[int, int]) -> str | None:
    return next((name for name, _, start, end in assignments if start <= span[0] and span[1] <= end), None)


def _assigned_credential(name: str, value: str) -> str | None:
    """What a value assigned to ``name`` is, when it is a credential: a literal (not a reference, path, URI,
    digest, number or flag) assigned to a credential's name that is random-looking, or any password."""
    if not value or not is_secret_name(name) or any(pattern.search(value) for pattern in _NOT_A_CREDENTIAL):
        return None
    if any(word.endswith(_PASSWORD_WORDS) for word in _words(name)) and len(value) >= 4:
        return "a password"  # a password need not look random to be one
    if _AWS_SECRET.match(value) and not _HEX.match(value) and _looks_random(value):
        return "a 40-character secret key (AWS-style)"
    if len(value) >= _MIN_LENGTH and _random_looking(value):
        return "a random-looking value"
    return None


def _random_looking(value: str) -> bool:
    if _HEX.match(value):
        return _bits_per_character(value) >= _MIN_BITS_HEX
    needed = min(_MAX_BITS_NEEDED, 0.85 * math.log2(len(value)))
    return _looks_random(value) and _bits_per_character(value) >= needed


def _looks_random(body: str) -> bool:
    """At least two of lower case, upper case and digits: generated tokens mix them, words and names do not."""
    classes = (any(c.islower() for c in body), any(c.isupper() for c in body), any(c.isdigit() for c in body))
    return sum(classes) >= 2


def _bits_per_character(value: str) -> float:
    """Shannon entropy of the value's characters."""
    counts = Counter(value)
    return -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())


def _finding(kind: str, value: str, name: str | None) -> Finding:
    return Finding(kind, _redacted(kind, value), name, value)


def _redacted(kind: str, value: str) -> str:
    """The first 4 characters and '…' for a long value (mostly the token's well-known prefix); only '…' for a
    short one, where 4 characters would give much of it away. A PEM header says no more than the kind."""
    if kind.startswith("a private key"):
        return "-----BEGIN … PRIVATE KEY-----"
    return f"{value[:4]}…" if len(value) >= 12 else "…"
