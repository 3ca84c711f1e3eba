"""CurveZMQ key files: the key pairs brokers authenticate each other with.

Rules
-----
* The format is ZeroMQ's certificate file (what ``zmq.auth.create_certificates``
  writes and ``zmq.auth.load_certificate`` reads): ``NAME.key`` holds the public key,
  ``NAME.key_secret`` the public and the secret key, both Z85 (40 characters), in a
  ZPL ``curve`` section. Any ZeroMQ tool reads our files and we read theirs.
* A secret key file is made 0600 with ``O_CREAT | O_EXCL | O_NOFOLLOW``: never
  through a symbolic link planted in its place, never over an existing key (an
  overwritten key locks its broker out of the cluster). ``force`` removes the old
  file first (the name, not what a link points to). The public file is 0644: it is
  handed to every peer.
* A secret key file that others may read, or that is a symbolic link, is refused
  when loaded (``ssh`` refuses such a private key for the same reason): the key is
  the broker's identity.
* Light: the standard library (and ``errors``, ``limits``) at import; ZeroMQ only
  where a key pair is made.

Theory of operation
-------------------
CurveZMQ authenticates each connection by its long-term public keys (the client
proves it holds the secret of the key it presents, and knows the server's public
key beforehand). A cluster's brokers each hold a key pair; every broker lists its
peers' public keys as allowed (``curve.allowed.public.keys`` or a directory of
``.key`` files, ``curve.allowed.public.keys.dir``): ``shmlog cluster keys`` makes
the pairs, the operator copies each secret file to its broker and the public
files to all.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import stat

from ..common import limits
from ..common.errors import InvalidConfigError

__all__ = ["KeyPair", "PUBLIC_SUFFIX", "SECRET_SUFFIX", "is_z85_key", "write_key_pair",
           "read_public_key", "read_key_pair", "read_public_keys_dir", "check_key_name"]

PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
# A 32-byte CURVE key in Z85 (ZeroMQ RFC 32): 40 characters of its 85-letter alphabet.
_Z85_KEY = re.compile(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")
_KEY_LINE = re.compile(r'^\s+(public|secret)-key\s*=\s*"([^"]*)"\s*$', re.MULTILINE)
_KEY_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{limits.CURVE_KEY_NAME_LENGTH_MAX - 1}}}")
_PUBLIC_MODE = 0o644
_SECRET_MODE = 0o600
_BANNER = """#   ****  Generated on {date} by shmlog cluster keys  ****
#   ZeroMQ CURVE {kind} Certificate
#   {advice}

metadata
    name = "{name}"
curve
"""


@dataclasses.dataclass(frozen=True)
class KeyPair:
    """A CURVE key pair, both keys in Z85 (``secret_key`` None for a peer's key)."""
    public_key: str
    secret_key: str | None = None


def is_z85_key(text) -> bool:
    """Is ``text`` a CURVE key in Z85 (40 characters of the Z85 alphabet)?"""
    return isinstance(text, str) and _Z85_KEY.fullmatch(text) is not None


def check_key_name(name: str) -> str:
    """``name`` if it can name a key file (``[A-Za-z0-9][A-Za-z0-9._-]*``, at most
    ``limits.CURVE_KEY_NAME_LENGTH_MAX`` characters).

    Raises
    ------
    InvalidConfigError
        It could escape the directory or is not a plain name.
    """
    if not isinstance(name, str) or not _KEY_NAME.fullmatch(name) or ".." in name:
        raise InvalidConfigError(f"a key name must be 1..{limits.CURVE_KEY_NAME_LENGTH_MAX} "
                                 f"characters of [A-Za-z0-9._-] "
                                 f"starting with a letter or digit, got {name!r:.100}")
    return name


def write_key_pair(directory: str, name: str, force: bool = False) -> KeyPair:
    """Make a new key pair and write ``directory/NAME.key`` (0644) and
    ``directory/NAME.key_secret`` (0600); returns it.

    Raises
    ------
    FileExistsError
        A key file of that name exists (or a symbolic link stands there) and
        ``force`` is false; nothing was written.
    InvalidConfigError
        ``name`` is not a plain name.
    """
    import zmq  # only here: reading keys needs no ZeroMQ
    check_key_name(name)
    public, secret = (key.decode("ascii") for key in zmq.curve_keypair())
    paths = [os.path.join(directory, name + suffix) for suffix in (SECRET_SUFFIX, PUBLIC_SUFFIX)]
    if not force:
        for path in paths:
            if os.path.lexists(path):
                raise FileExistsError(f"{path} exists: a key is never overwritten "
                                      f"(--force replaces it)")
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    _write(paths[0], _SECRET_MODE, force, _BANNER.format(
        date=date, kind="**Secret**", name=name,
        advice="DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.")
        + f'    public-key = "{public}"\n    secret-key = "{secret}"\n')
    _write(paths[1], _PUBLIC_MODE, force, _BANNER.format(
        date=date, kind="Public", name=name,
        advice="Exchange securely, or use a secure mechanism to verify the contents "
               "of this file after exchange.") + f'    public-key = "{public}"\n')
    return KeyPair(public, secret)


def _write(path: str, mode: int, force: bool, text: str) -> None:
    """Create ``path`` anew with ``mode`` (never through a link, never over a file
    unless ``force``, which removes the old name first)."""
    if force and os.path.lexists(path):
        os.unlink(path)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, mode)
    with os.fdopen(descriptor, "w", encoding="ascii") as file:
        os.fchmod(descriptor, mode)          # the umask may have narrowed it
        file.write(text)


def _keys_in(path: str, setting: str, secret: bool) -> dict[str, str]:
    """The ``public``/``secret`` keys of a certificate file, checked."""
    flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_NOFOLLOW if secret else 0)
    try:
        descriptor = os.open(path, flags)
        with os.fdopen(descriptor, encoding="ascii", errors="replace") as file:
            status = os.fstat(file.fileno())
            if secret and stat.S_IMODE(status.st_mode) & 0o077:
                raise InvalidConfigError(
                    f"{setting}: {path} has mode {stat.S_IMODE(status.st_mode):o}: a secret key "
                    f"file must be readable by its owner only (chmod 600)")
            text = file.read(limits.CURVE_KEY_FILE_SIZE_MAX)
    except OSError as error:
        raise InvalidConfigError(f"{setting}: cannot read {path}: {error}") from error
    keys = {kind: value for kind, value in _KEY_LINE.findall(text)}
    for kind in ("public", "secret") if secret else ("public",):
        if not is_z85_key(keys.get(kind)):
            raise InvalidConfigError(f"{setting}: {path} holds no valid {kind}-key (a ZeroMQ "
                                     f"certificate file with a 40-character Z85 key)")
    return keys


def read_public_key(path: str, setting: str = "curve.allowed.public.keys.dir") -> str:
    """The public key (Z85) in certificate file ``path``.

    Raises
    ------
    InvalidConfigError
        It cannot be read or holds no valid public key (``setting`` names where it
        was configured).
    """
    return _keys_in(path, setting, secret=False)["public"]


def read_key_pair(path: str, setting: str = "curve.secret.key.file") -> KeyPair:
    """The key pair in secret certificate file ``path`` (not through a symbolic link,
    readable by its owner only).

    Raises
    ------
    InvalidConfigError
        It is a link, others may read it, it cannot be read, or it holds no valid
        keys.
    """
    keys = _keys_in(path, setting, secret=True)
    return KeyPair(keys["public"], keys["secret"])


def read_public_keys_dir(directory: str,
                         setting: str = "curve.allowed.public.keys.dir") -> list[str]:
    """The public keys of every ``*.key`` file in ``directory`` (sorted by file name).

    Raises
    ------
    InvalidConfigError
        The directory cannot be listed, or a ``.key`` file in it is not valid.
    """
    try:
        names = sorted(name for name in os.listdir(directory) if name.endswith(PUBLIC_SUFFIX))
    except OSError as error:
        raise InvalidConfigError(f"{setting}: cannot list {directory}: {error}") from error
    return [read_public_key(os.path.join(directory, name), setting) for name in names]
