"""CurveZMQ keys and settings: ``shmlog cluster keys``, ``curve_keys`` and the
``[cluster]`` security settings.

Goal: key files are ZeroMQ's certificate format (pyzmq's own reader reads ours, ours
reads its), the secret file is 0600, never written through a planted symbolic link
and never over an existing key unless forced; a secret file others may read, or a
link, is refused when loaded; with curve (the default) a broker config without a
secret key file or without allowed peers is refused, naming the setting, and plain
TCP is taken only when written.

Method: real files in a temporary directory, ``zmq.auth.load_certificate`` as the
reference reader, the ``shmlog`` command in-process (``cli.main``), and
``ClusterConfig.from_mapping`` / ``CurveSecurity.from_config`` on tables.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
import zmq
import zmq.auth

from shmlog import cli
from shmlog.common.errors import InvalidConfigError
from shmlog.config import curve_keys
from shmlog.config.cluster import ClusterConfig
from shmlog.zmq_replication import CurveSecurity

BASE = {"cluster.id": "c1", "broker.id": 1, "zookeeper.connect": "127.0.0.1:2181",
        "replication.endpoint": "tcp://127.0.0.2:19091"}


def mode_of(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_key_files_are_zeromq_certificates_with_private_secrets(tmp_path):
    pair = curve_keys.write_key_pair(str(tmp_path), "broker-1")
    public_file, secret_file = tmp_path / "broker-1.key", tmp_path / "broker-1.key_secret"
    assert mode_of(secret_file) == 0o600
    assert mode_of(public_file) == 0o644
    assert zmq.auth.load_certificate(str(secret_file)) == \
        (pair.public_key.encode(), pair.secret_key.encode())
    assert zmq.auth.load_certificate(str(public_file)) == (pair.public_key.encode(), None)
    assert zmq.curve_public(pair.secret_key.encode()).decode() == pair.public_key
    assert curve_keys.read_key_pair(str(secret_file)) == pair
    assert curve_keys.read_public_key(str(public_file)) == pair.public_key
    # And pyzmq's files read as ours.
    zmq.auth.create_certificates(str(tmp_path), "theirs")
    os.chmod(tmp_path / "theirs.key_secret", 0o600)
    theirs = zmq.auth.load_certificate(str(tmp_path / "theirs.key_secret"))
    assert curve_keys.read_key_pair(str(tmp_path / "theirs.key_secret")) == \
        curve_keys.KeyPair(theirs[0].decode(), theirs[1].decode())
    assert curve_keys.read_public_keys_dir(str(tmp_path)) == \
        [pair.public_key, theirs[0].decode()]


def test_an_existing_key_is_never_overwritten_unless_forced(tmp_path):
    first = curve_keys.write_key_pair(str(tmp_path), "b")
    with pytest.raises(FileExistsError, match="never overwritten"):
        curve_keys.write_key_pair(str(tmp_path), "b")
    assert curve_keys.read_key_pair(str(tmp_path / "b.key_secret")) == first
    second = curve_keys.write_key_pair(str(tmp_path), "b", force=True)
    assert second != first
    assert curve_keys.read_key_pair(str(tmp_path / "b.key_secret")) == second
    assert mode_of(tmp_path / "b.key_secret") == 0o600


def test_a_planted_symbolic_link_is_never_written_through(tmp_path):
    target = tmp_path / "target"
    target.write_text("precious")
    os.symlink(target, tmp_path / "b.key_secret")
    with pytest.raises(FileExistsError):
        curve_keys.write_key_pair(str(tmp_path), "b")
    assert target.read_text() == "precious"
    assert not (tmp_path / "b.key").exists()
    # --force replaces the link itself, never its target.
    curve_keys.write_key_pair(str(tmp_path), "b", force=True)
    assert target.read_text() == "precious"
    assert not os.path.islink(tmp_path / "b.key_secret")
    assert mode_of(tmp_path / "b.key_secret") == 0o600


def test_a_secret_others_may_read_or_a_linked_secret_is_refused(tmp_path):
    curve_keys.write_key_pair(str(tmp_path), "b")
    secret_file = tmp_path / "b.key_secret"
    os.chmod(secret_file, 0o640)
    with pytest.raises(InvalidConfigError, match=r"curve.secret.key.file: .* mode 640"):
        curve_keys.read_key_pair(str(secret_file))
    os.chmod(secret_file, 0o600)
    os.symlink(secret_file, tmp_path / "link.key_secret")
    with pytest.raises(InvalidConfigError, match="cannot read"):
        curve_keys.read_key_pair(str(tmp_path / "link.key_secret"))
    (tmp_path / "bad.key").write_text('curve\n    public-key = "short"\n')
    with pytest.raises(InvalidConfigError, match="no valid public-key"):
        curve_keys.read_public_keys_dir(str(tmp_path))


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "a" * 101, "a..b"])
def test_key_names_cannot_leave_the_directory(name, tmp_path):
    with pytest.raises(InvalidConfigError, match="key name"):
        curve_keys.write_key_pair(str(tmp_path), name)
    assert os.listdir(tmp_path) == []


def test_shmlog_cluster_keys(tmp_path, capsys):
    out = str(tmp_path / "keys")
    assert cli.main(["cluster", "keys", "--out", out, "--json", "b1", "b2"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert sorted(os.listdir(out)) == ["b1.key", "b1.key_secret", "b2.key", "b2.key_secret"]
    assert mode_of(out) == 0o700
    for name in ("b1", "b2"):
        assert curve_keys.read_public_key(os.path.join(out, f"{name}.key")) == printed[name]
    # Nothing is written when one key exists: exit 1, b3 not made.
    assert cli.main(["cluster", "keys", "--out", out, "b3", "b1"]) == 1
    assert "b1.key" in capsys.readouterr().err and not os.path.exists(f"{out}/b3.key")
    assert cli.main(["cluster", "keys", "--out", out, "--force", "b1"]) == 0
    assert printed["b1"] not in capsys.readouterr().out


def test_curve_is_the_default_and_needs_a_secret_key_and_allowed_peers():
    with pytest.raises(InvalidConfigError, match="curve.secret.key.file must name"):
        ClusterConfig.from_mapping(BASE)
    with pytest.raises(InvalidConfigError, match="curve.allowed.public.keys or "
                                                 "curve.allowed.public.keys.dir must name"):
        ClusterConfig.from_mapping({**BASE, "curve.secret.key.file": "/k/b.key_secret"})
    for allowed in ({"curve.allowed.public.keys": ["x" * 40]},
                    {"curve.allowed.public.keys.dir": "/k"}):
        config = ClusterConfig.from_mapping({**BASE, "curve.secret.key.file": "/k/s", **allowed})
        assert config.curve and config.security_inter_broker_protocol == "curve"
    plain = ClusterConfig.from_mapping({**BASE, "security.inter.broker.protocol": "plaintext"})
    assert not plain.curve


@pytest.mark.parametrize("setting, value, message", [
    ("security.inter.broker.protocol", "ssl", "security.inter.broker.protocol must be one of"),
    ("security.inter.broker.protocol", "CURVE", "security.inter.broker.protocol must be one of"),
    ("curve.allowed.public.keys", ["short"], "curve.allowed.public.keys must be a list"),
    ("curve.allowed.public.keys", "x" * 40, "curve.allowed.public.keys must be a list"),
    ("curve.secret.key.file", "", "curve.secret.key.file must be a non-empty string"),
    ("curve.allowed.public.keys.dir", 3, "curve.allowed.public.keys.dir must be a non-empty"),
])
def test_bad_security_settings_are_refused_by_name(setting, value, message):
    with pytest.raises(InvalidConfigError, match=message):
        ClusterConfig.from_mapping({**BASE, "security.inter.broker.protocol": "plaintext",
                                    setting: value})


def test_security_settings_round_trip_through_toml(tmp_path):
    import tomllib
    config = ClusterConfig.from_mapping({**BASE, "curve.secret.key.file": "/k/s",
                                         "curve.allowed.public.keys": ["x" * 40, "y" * 40]})
    assert config.curve_allowed_public_keys == ("x" * 40, "y" * 40)
    assert ClusterConfig.from_mapping(tomllib.loads(config.to_toml())["cluster"]) == config


def test_curve_security_reads_the_configured_files(tmp_path):
    pair = curve_keys.write_key_pair(str(tmp_path), "b1")
    peer = curve_keys.write_key_pair(str(tmp_path), "b2")
    extra = zmq.curve_keypair()[0].decode()
    config = ClusterConfig.from_mapping({
        **BASE, "curve.secret.key.file": str(tmp_path / "b1.key_secret"),
        "curve.allowed.public.keys.dir": str(tmp_path), "curve.allowed.public.keys": [extra]})
    security = CurveSecurity.from_config(config)
    assert (security.public_key, security.secret_key) == (pair.public_key, pair.secret_key)
    assert security.allowed_public_keys == {pair.public_key, peer.public_key, extra}
    assert CurveSecurity.from_config(
        ClusterConfig.from_mapping({**BASE, "security.inter.broker.protocol": "plaintext"})) \
        is None
    # A secret file whose public key is another's, and a directory of no keys.
    text = (tmp_path / "b1.key_secret").read_text().replace(pair.public_key, peer.public_key)
    os.unlink(tmp_path / "b1.key_secret")
    os.close(os.open(tmp_path / "b1.key_secret", os.O_CREAT | os.O_WRONLY, 0o600))
    (tmp_path / "b1.key_secret").write_text(text)
    with pytest.raises(InvalidConfigError, match="not its public key's"):
        CurveSecurity.from_config(config)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidConfigError, match="holds no .key file"):
        CurveSecurity.from_config(ClusterConfig.from_mapping({
            **BASE, "curve.secret.key.file": str(tmp_path / "b2.key_secret"),
            "curve.allowed.public.keys.dir": str(empty)}))
