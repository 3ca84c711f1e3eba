"""The users Kafka clients log in as: SCRAM credentials, never a password, in a TOML file.

Rules
-----
* The file (``sasl.credentials.file``, shmlog's setting: Kafka keeps SCRAM
  credentials in ZooKeeper and PLAIN passwords in a JAAS file) holds, per user and
  mechanism, what Kafka stores for SCRAM (``ScramCredential``: salt, stored key,
  server key, iterations), base64 as in Kafka's
  ``SCRAM-SHA-256=[salt=...,stored_key=...,server_key=...,iterations=...]``::

      [users.alice]
      "SCRAM-SHA-256" = { salt = "...", stored_key = "...", server_key = "...", iterations = 8192 }
      "SCRAM-SHA-512" = { salt = "...", stored_key = "...", server_key = "...", iterations = 8192 }

  ``python -m shmlog.wire.credentials alice`` prints such an entry from a password
  read from the terminal (or standard input): append it to the file.
* No password is stored, for PLAIN either: PLAIN checks the password it is sent
  against the user's SCRAM credential (SCRAM-SHA-512 if the user has one, else
  SCRAM-SHA-256) by deriving the stored key from it, so a user logs in with the same
  password over either mechanism, and a stolen file gives no password away (only
  what a dictionary attack at the iteration count's cost recovers).
* Passwords and names are their UTF-8 bytes, unnormalised: Kafka's ``ScramFormatter``
  and its clients apply no SASLprep, so neither may we (a name or password that
  SASLprep would change would then fail against Kafka's clients).
* The file is a secret (``wire.files``: the broker's user's or root's, mode 600, no
  symbolic link). Checked whole when read: a user name is 1..255 bytes without NUL
  (PLAIN's separator), a mechanism is SCRAM-SHA-256 or SCRAM-SHA-512, keys are the
  hash's length, iterations within Kafka's bounds, no key unknown. Every refusal is
  an :class:`~shmlog.common.errors.InvalidConfigError` naming the setting, the file
  and the entry, never a key's value.

Theory of operation
-------------------
RFC 5802: ``SaltedPassword = PBKDF2(password, salt, i)``, ``ClientKey =
HMAC(SaltedPassword, "Client Key")``, ``StoredKey = H(ClientKey)``, ``ServerKey =
HMAC(SaltedPassword, "Server Key")``. The server keeps StoredKey and ServerKey: a
client proves it knows ClientKey (hence the password) without sending either, and
the server proves it knows ServerKey. :func:`scram_credential` computes them;
:meth:`Credentials.verify_password` recomputes StoredKey from a PLAIN password and
compares it in constant time.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import getpass
import hashlib
import hmac
import secrets
import sys
import tomllib
from typing import Any, Mapping

from ..common import limits
from ..common.errors import InvalidConfigError
from . import files

__all__ = ["SCRAM_HASHES", "ScramCredential", "Credentials", "scram_credential",
           "salted_password", "toml_string", "user_entry", "load", "parse", "main"]

# The SCRAM mechanisms Kafka has, and their hash (hashlib's name).
SCRAM_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
_FIELDS = ("salt", "stored_key", "server_key", "iterations")
SETTING = "sasl.credentials.file"


@dataclasses.dataclass(frozen=True, repr=False)
class ScramCredential:
    """What the server keeps of one user's password for one SCRAM mechanism."""
    mechanism: str
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def __repr__(self) -> str:                 # keys stay out of logs and tracebacks
        return f"ScramCredential({self.mechanism}, iterations={self.iterations})"

    @property
    def hash_name(self) -> str:
        return SCRAM_HASHES[self.mechanism]

    def as_toml(self) -> str:
        fields = {name: base64.b64encode(getattr(self, name)).decode("ascii")
                  for name in _FIELDS[:3]}
        return (f'"{self.mechanism}" = {{ salt = "{fields["salt"]}", stored_key = '
                f'"{fields["stored_key"]}", server_key = "{fields["server_key"]}", '
                f'iterations = {self.iterations} }}')


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string: quotes, backslashes and control characters
    escaped (TOML takes no surrogate escapes, so the rest stays as it is)."""
    return '"' + "".join(f"\\u{ord(char):04x}" if char in '"\\' or ord(char) < 0x20
                         or ord(char) == 0x7f else char for char in text) + '"'


def salted_password(password: bytes, salt: bytes, iterations: int, hash_name: str) -> bytes:
    """RFC 5802's Hi(): PBKDF2 with HMAC over the mechanism's hash."""
    return hashlib.pbkdf2_hmac(hash_name, password, salt, iterations)


def scram_credential(password: str, mechanism: str,
                     iterations: int = limits.SCRAM_ITERATIONS_DEFAULT,
                     salt: bytes | None = None) -> ScramCredential:
    """The credential of ``password`` for ``mechanism`` (a new random salt unless one
    is given).

    Raises
    ------
    InvalidConfigError
        An unknown mechanism, or iterations outside Kafka's bounds.
    """
    if mechanism not in SCRAM_HASHES:
        raise InvalidConfigError(f"SCRAM mechanism {mechanism!r:.50} is none of "
                                 f"{', '.join(SCRAM_HASHES)}")
    _check_iterations(iterations, f"{mechanism}'s iterations")
    salt = secrets.token_bytes(limits.SCRAM_SALT_SIZE) if salt is None else salt
    hash_name = SCRAM_HASHES[mechanism]
    salted = salted_password(password.encode("utf-8"), salt, iterations, hash_name)
    client_key = hmac.digest(salted, b"Client Key", hash_name)
    return ScramCredential(mechanism, salt, hashlib.new(hash_name, client_key).digest(),
                           hmac.digest(salted, b"Server Key", hash_name), iterations)


def user_entry(user: str, password: str, mechanisms=tuple(SCRAM_HASHES),
               iterations: int = limits.SCRAM_ITERATIONS_DEFAULT) -> str:
    """A user's table for the credentials file: a credential per mechanism.

    Raises
    ------
    InvalidConfigError
        The name cannot be a user's, an unknown mechanism, iterations out of bounds.
    """
    _check_user(user, "user name")
    lines = [f"[users.{toml_string(user)}]"]
    lines += [scram_credential(password, mechanism, iterations).as_toml()
              for mechanism in mechanisms]
    return "\n".join(lines) + "\n"


class Credentials:
    """Every user's SCRAM credentials, read from the credentials file."""

    def __init__(self, users: Mapping[str, Mapping[str, ScramCredential]]):
        self._users = {user: dict(credentials) for user, credentials in users.items()}

    def __repr__(self) -> str:
        return f"Credentials({len(self._users)} users)"

    def __len__(self) -> int:
        return len(self._users)

    def scram(self, user: str, mechanism: str) -> ScramCredential | None:
        """``user``'s credential for ``mechanism``, None when there is none."""
        return self._users.get(user, {}).get(mechanism)

    def for_plain(self, user: str) -> ScramCredential | None:
        """The credential PLAIN checks ``user``'s password against."""
        credentials = self._users.get(user, {})
        return credentials.get("SCRAM-SHA-512") or credentials.get("SCRAM-SHA-256")

    @staticmethod
    def verify_password(credential: ScramCredential, password: bytes) -> bool:
        """Does ``password`` derive ``credential``'s stored key? (constant time in the
        comparison; the derivation costs the credential's iterations)"""
        salted = salted_password(password, credential.salt, credential.iterations,
                                 credential.hash_name)
        client_key = hmac.digest(salted, b"Client Key", credential.hash_name)
        stored_key = hashlib.new(credential.hash_name, client_key).digest()
        return hmac.compare_digest(stored_key, credential.stored_key)


def load(path: str, setting: str = SETTING) -> Credentials:
    """The credentials in file ``path``, checked as a secret and whole.

    Raises
    ------
    InvalidConfigError
        It is not private, not TOML, or an entry is invalid (the message names it).
    """
    size_max = limits.SASL_CREDENTIALS_FILE_SIZE_MAX
    with files.opened(path, setting, size_max, private=True, follow_links=False) as descriptor:
        data = files.read(descriptor, path, setting, size_max)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidConfigError(f"{setting}: {path} is not UTF-8 text ({error})") from None
    return parse(text, f"{setting}: {path}")


def parse(text: str, source: str = SETTING) -> Credentials:
    """The credentials in TOML ``text`` (``source`` begins each error's message).

    Raises
    ------
    InvalidConfigError
        Not TOML, or an entry is invalid.
    """
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise InvalidConfigError(f"{source} is not TOML: {error}") from None
    unknown = set(document) - {"users"}
    if unknown:
        raise InvalidConfigError(f"{source}: unknown tables or keys {sorted(unknown)}: the "
                                 f"file holds [users.NAME] tables only")
    users = document.get("users", {})
    if not isinstance(users, dict):
        raise InvalidConfigError(f"{source}: users must be a table of [users.NAME] tables")
    return Credentials({user: _user(user, entry, source) for user, entry in users.items()})


def _user(user: str, entry: Any, source: str) -> dict[str, ScramCredential]:
    _check_user(user, f"{source}: user name")
    where = f"{source}: users.{toml_string(user)}"
    if not isinstance(entry, dict) or not entry:
        raise InvalidConfigError(f"{where} must be a table of one credential per SCRAM "
                                 f"mechanism ({', '.join(SCRAM_HASHES)})")
    found = {}
    for mechanism, fields in entry.items():
        if mechanism not in SCRAM_HASHES:
            raise InvalidConfigError(f"{where}: {mechanism!r:.50} is none of the SCRAM "
                                     f"mechanisms {', '.join(SCRAM_HASHES)}")
        found[mechanism] = _credential(mechanism, fields, f"{where}.{mechanism}")
    return found


def _credential(mechanism: str, fields: Any, where: str) -> ScramCredential:
    if not isinstance(fields, dict) or set(fields) != set(_FIELDS):
        keys = sorted(fields) if isinstance(fields, dict) else type(fields).__name__
        raise InvalidConfigError(f"{where} must be a table of exactly "
                                 f"{', '.join(_FIELDS)}, got {keys}")
    _check_iterations(fields["iterations"], f"{where}.iterations")
    size = hashlib.new(SCRAM_HASHES[mechanism]).digest_size
    values = {}
    for name, length in (("salt", None), ("stored_key", size), ("server_key", size)):
        try:
            value = base64.b64decode(fields[name], validate=True) \
                if isinstance(fields[name], str) else None
        except (binascii.Error, ValueError):
            value = None
        if not value or (length is not None and len(value) != length):
            raise InvalidConfigError(f"{where}.{name} must be base64 of "
                                     f"{f'{length} bytes' if length else 'some bytes'}")
        values[name] = value
    return ScramCredential(mechanism, values["salt"], values["stored_key"],
                           values["server_key"], fields["iterations"])


def _check_iterations(iterations: Any, where: str) -> None:
    if type(iterations) is not int or not \
            limits.SCRAM_ITERATIONS_MIN <= iterations <= limits.SCRAM_ITERATIONS_MAX:
        raise InvalidConfigError(f"{where} must be an integer in "
                                 f"{limits.SCRAM_ITERATIONS_MIN}..{limits.SCRAM_ITERATIONS_MAX} "
                                 f"(Kafka's bounds), got {iterations!r:.50}")


def _check_user(user: Any, where: str) -> None:
    if not isinstance(user, str) or not user or "\0" in user or \
            len(user.encode("utf-8", "surrogatepass")) > limits.SASL_USERNAME_SIZE_MAX:
        raise InvalidConfigError(f"{where} {user!r:.100} must be "
                                 f"1..{limits.SASL_USERNAME_SIZE_MAX} bytes of UTF-8 without NUL")


def main(argv: list[str] | None = None) -> int:
    """``python -m shmlog.wire.credentials USER [--iterations N] [--mechanism M ...]``:
    print USER's entry for the credentials file, the password read from the
    terminal (twice) or from standard input's first line."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m shmlog.wire.credentials",
                                     description=main.__doc__)
    parser.add_argument("user")
    parser.add_argument("--iterations", type=int, default=limits.SCRAM_ITERATIONS_DEFAULT)
    parser.add_argument("--mechanism", action="append", choices=sorted(SCRAM_HASHES),
                        help="one per flag; both when none is given")
    options = parser.parse_args(argv)
    if sys.stdin.isatty():
        password = getpass.getpass(f"password for {options.user}: ")
        if getpass.getpass("again: ") != password:
            print("the passwords differ: nothing printed", file=sys.stderr)
            return 1
    else:
        password = sys.stdin.readline().rstrip("\n")
    if not password:
        print("an empty password: nothing printed", file=sys.stderr)
        return 1
    try:
        sys.stdout.write(user_entry(options.user, password,
                                    options.mechanism or tuple(SCRAM_HASHES),
                                    options.iterations))
    except InvalidConfigError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
