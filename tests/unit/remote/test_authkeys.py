"""gaudi_launch.remote.authkeys: the container's authorized_keys, with the real ssh-keygen."""

from __future__ import annotations

import subprocess

import pytest

from gaudi_launch.remote.authkeys import BadKey, key_blob, setup, to_append


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    out = {}
    for name in ("leader", "other"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(d / name)],
            check=True,
            stdin=subprocess.DEVNULL,
        )
        out[name] = (d / f"{name}.pub").read_text().strip()
        out[name + "-private"] = (d / name).read_text()
    return out


def test_blob_is_found_behind_options_and_before_comments():
    assert key_blob('from="10.0.0.1",no-pty ssh-ed25519 AAAAC3Nz leader@x') == "AAAAC3Nz"
    assert key_blob("ecdsa-sha2-nistp256 AAAAE2V") == "AAAAE2V"
    assert key_blob("# ssh-ed25519") is None and key_blob("garbage") is None


def test_appends_once_by_key_and_never_glues_the_last_line():
    existing = "ssh-ed25519 AAAA1 old comment"  # no final newline
    text, added, present = to_append(
        existing, ["ssh-ed25519 AAAA1 same key, other comment", "ssh-ed25519 AAAA2 new", "ssh-ed25519 AAAA2 new again"]
    )
    assert (text, added, present) == ("\nssh-ed25519 AAAA2 new\n", 1, 2)
    assert to_append("", ["ssh-ed25519 AAAA3 x"]) == ("ssh-ed25519 AAAA3 x\n", 1, 0)


def env_for(tmp_path, **extra):
    return {"SSHD_AUTHORIZED_KEYS": str(tmp_path / "ssh" / "authorized_keys"), **extra}


def test_worker_gets_the_leader_key_once_across_restarts(tmp_path, keys):
    env = env_for(tmp_path, AUTHORIZED_KEY=keys["leader"])
    assert setup(True, None, env) == [
        f"authorized keys from AUTHORIZED_KEY: 1 added, 0 already in {env['SSHD_AUTHORIZED_KEYS']}"
    ]
    assert "1 already in" in setup(True, None, env)[0]  # a restart adds nothing
    assert open(env["SSHD_AUTHORIZED_KEYS"]).read() == keys["leader"] + "\n"
    assert (tmp_path / "ssh").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    "case,message",
    [
        ("none", "no authorized key: nobody could log in"),
        ("empty", "AUTHORIZED_KEY is set but empty"),
        ("missing", "does not exist (mount the leader's public key there)"),
        ("private", "holds a PRIVATE key"),
        ("garbage", "is not an SSH public key: 'ssh-ed25519 not-a-key'"),
    ],
)
def test_bad_input_is_refused_with_its_reason(tmp_path, keys, case, message):
    extra = {
        "none": {},
        "empty": {"AUTHORIZED_KEY": ""},
        "missing": {"AUTHORIZED_KEYS_FILE": str(tmp_path / "nowhere.pub")},
        "private": {"AUTHORIZED_KEY": keys["leader-private"]},
        "garbage": {"AUTHORIZED_KEY": "ssh-ed25519 not-a-key"},
    }[case]
    with pytest.raises(BadKey) as err:
        setup(True, None, env_for(tmp_path, **extra))
    assert message in str(err.value)
    assert "PRIVATE KEY-----" not in str(err.value) and keys["leader-private"].splitlines()[1] not in str(err.value)
    assert open(tmp_path / "ssh" / "authorized_keys").read() == ""


def test_keys_already_there_are_enough_for_a_worker(tmp_path, keys):
    env = env_for(tmp_path)
    (tmp_path / "ssh").mkdir()
    (tmp_path / "ssh" / "authorized_keys").write_text(keys["other"])
    assert "using the keys already in" in setup(True, None, env)[0]
    assert setup(False, None, env_for(tmp_path / "leader")) == []  # the leader needs none
