"""The SASL credentials file: SCRAM credentials made from a password, written as TOML,
read back only from a private file, checked whole.

Goal: an entry made by ``user_entry`` (or ``python -m shmlog.wire.credentials``)
reads back to credentials that verify its password and no other, for names any
TOML string holds; the file is refused unless it is a regular file of the
broker's user (or root), mode 600, not a link, of bounded size; every invalid
entry is an ``InvalidConfigError`` naming the setting, the file and the entry, and
no error repeats a key.

Method: real files in a temporary directory (chown to another user where the test
runs as root), ``credentials.load``/``parse`` on them, ``credentials.main`` with a
password on standard input.
"""

from __future__ import annotations

import base64
import io
import os
import sys

import pytest

from shmlog.common import limits
from shmlog.common.errors import InvalidConfigError
from shmlog.wire import credentials

ENTRY = credentials.user_entry("alice", "alice-secret")


def private_file(tmp_path, text, mode=0o600, name="users.toml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    os.chmod(path, mode)
    return str(path)


def test_an_entry_reads_back_to_credentials_of_its_password(tmp_path):
    users = credentials.load(private_file(tmp_path, ENTRY))
    assert len(users) == 1
    for mechanism in credentials.SCRAM_HASHES:
        credential = users.scram("alice", mechanism)
        assert credential.iterations == limits.SCRAM_ITERATIONS_DEFAULT
        assert len(credential.salt) == limits.SCRAM_SALT_SIZE
        assert credentials.Credentials.verify_password(credential, b"alice-secret")
        assert not credentials.Credentials.verify_password(credential, b"alice-secreT")
    assert users.for_plain("alice").mechanism == "SCRAM-SHA-512"
    assert users.scram("bob", "SCRAM-SHA-256") is None and users.for_plain("bob") is None
    assert "alice-secret" not in ENTRY
    assert repr(users.scram("alice", "SCRAM-SHA-256")) == \
        "ScramCredential(SCRAM-SHA-256, iterations=8192)"


@pytest.mark.parametrize("user", ['quote"back\\slash', "tab\tand\x7f", "ünïcødé 😀", "a,b=c",
                                  "x" * 255, " spaced "])
def test_any_name_a_toml_string_holds_round_trips(user):
    entry = credentials.user_entry(user, "pw", ("SCRAM-SHA-256",), iterations=4096)
    users = credentials.parse(entry)
    assert credentials.Credentials.verify_password(users.scram(user, "SCRAM-SHA-256"), b"pw")
    assert users.scram(user, "SCRAM-SHA-512") is None


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o700 | 0o004])
def test_a_file_others_may_read_or_write_is_refused(tmp_path, mode):
    path = private_file(tmp_path, ENTRY, mode)
    with pytest.raises(InvalidConfigError, match=r"sasl.credentials.file: .*chmod 600"):
        credentials.load(path)


def test_a_symbolic_link_is_refused_even_to_a_private_file(tmp_path):
    target = private_file(tmp_path, ENTRY)
    os.symlink(target, tmp_path / "link.toml")
    with pytest.raises(InvalidConfigError, match="symbolic link is refused"):
        credentials.load(str(tmp_path / "link.toml"))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user takes root")
def test_another_users_file_is_refused(tmp_path):
    path = private_file(tmp_path, ENTRY)
    os.chown(path, 65534, 65534)
    with pytest.raises(InvalidConfigError, match="belongs to"):
        credentials.load(path)


def test_what_is_no_regular_file_of_bounded_size_is_refused(tmp_path):
    with pytest.raises(InvalidConfigError, match="not a regular file"):
        credentials.load(str(tmp_path))
    os.mkfifo(tmp_path / "fifo", 0o600)
    with pytest.raises(InvalidConfigError, match="not a regular file"):
        credentials.load(str(tmp_path / "fifo"))
    with pytest.raises(InvalidConfigError, match="cannot open"):
        credentials.load(str(tmp_path / "missing.toml"))
    big = private_file(tmp_path, "", name="big.toml")
    os.truncate(big, limits.SASL_CREDENTIALS_FILE_SIZE_MAX + 1)
    with pytest.raises(InvalidConfigError, match="right file"):
        credentials.load(big)
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b"# caf\xe9\n")
    os.chmod(latin, 0o600)
    with pytest.raises(InvalidConfigError, match="not UTF-8"):
        credentials.load(str(latin))
    for value in ("", None, 3):
        with pytest.raises(InvalidConfigError, match="must be the path"):
            credentials.load(value)


def field_line(**changes):
    fields = {"salt": '"c2FsdA=="', "stored_key": '"' + base64.b64encode(bytes(32)).decode() + '"',
              "server_key": '"' + base64.b64encode(bytes(32)).decode() + '"',
              "iterations": "4096"}
    fields.update(changes)
    inner = ", ".join(f"{name} = {value}" for name, value in fields.items() if value is not None)
    return f'[users.alice]\n"SCRAM-SHA-256" = {{ {inner} }}\n'


@pytest.mark.parametrize("text, words", [
    ("users = [", "not TOML"), ("[groups.x]\n", "unknown tables"), ("users = 3\n", "table of"),
    ("[users.alice]\n", "one credential per"), ('[users.""]\n"SCRAM-SHA-256" = {}\n', "user name"),
    ('[users."a\\u0000b"]\n', "without NUL"), (f'[users.{"x" * 256}]\n', "1..255"),
    ('[users.alice]\nPLAIN = "secret"\n', "none of the SCRAM"),
    ('[users.alice]\n"SCRAM-SHA-256" = "x"\n', "exactly"),
    (field_line(salt=None), "exactly"), (field_line(extra="1"), "exactly"),
    (field_line(salt='"not base64!"'), "salt must be base64"), (field_line(salt='""'), "salt"),
    (field_line(salt="3"), "salt must be base64"),
    (field_line(stored_key='"c2FsdA=="'), "stored_key must be base64 of 32 bytes"),
    (field_line(server_key='"' + base64.b64encode(bytes(64)).decode() + '"'), "server_key"),
    (field_line(iterations="4095"), "4096..16384"), (field_line(iterations="16385"), "4096"),
    (field_line(iterations="true"), "integer"), (field_line(iterations='"4096"'), "integer"),
    (field_line(iterations="4096.0"), "integer")])
def test_invalid_files_are_refused_naming_the_entry(tmp_path, text, words):
    path = private_file(tmp_path, text)
    with pytest.raises(InvalidConfigError, match=words) as caught:
        credentials.load(path)
    assert str(caught.value).startswith(f"sasl.credentials.file: {path}")
    assert base64.b64encode(bytes(32)).decode() not in str(caught.value)


def test_a_table_of_the_four_fields_is_read():
    users = credentials.parse(field_line())
    assert users.scram("alice", "SCRAM-SHA-256").salt == b"salt"


@pytest.mark.parametrize("arguments, words", [
    (("SCRAM-SHA-1", 4096), "none of"), (("SCRAM-SHA-256", 1000), "4096..16384"),
    (("SCRAM-SHA-256", 1 << 20), "4096..16384")])
def test_credentials_are_made_only_within_kafkas_bounds(arguments, words):
    mechanism, iterations = arguments
    with pytest.raises(InvalidConfigError, match=words):
        credentials.scram_credential("pw", mechanism, iterations)
    with pytest.raises(InvalidConfigError, match="user name"):
        credentials.user_entry("a\0b", "pw")


def test_the_tool_prints_an_entry_from_a_password_on_standard_input(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("tool-secret\n"))
    assert credentials.main(["carol", "--iterations", "4096",
                             "--mechanism", "SCRAM-SHA-512"]) == 0
    users = credentials.parse(capsys.readouterr().out)
    credential = users.scram("carol", "SCRAM-SHA-512")
    assert credential.iterations == 4096 and users.scram("carol", "SCRAM-SHA-256") is None
    assert credentials.Credentials.verify_password(credential, b"tool-secret")
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))
    assert credentials.main(["carol"]) == 1
    assert "empty password" in capsys.readouterr().err
    monkeypatch.setattr(sys, "stdin", io.StringIO("pw\n"))
    assert credentials.main(["carol", "--iterations", "10"]) == 1
    assert "4096..16384" in capsys.readouterr().err
