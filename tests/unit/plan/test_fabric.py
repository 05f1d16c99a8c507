from __future__ import annotations

import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gaudi_launch.errors import UserError
from gaudi_launch.plan import fabric
from gaudi_launch.plan.fabric import (
    AMAZON_LIBS,
    DEFAULT_OFI_WRAPPER,
    IFNAME_HINT,
    Interface,
    choose_interface,
    efa_env,
    efa_present,
    exported_names,
    fabric_env,
    parse_ip_addr,
    subnet_cidr,
)

# ---------------------------------------------------------------- exported_names


def test_exported_names_realistic_env():
    env = {
        "HCCL_COMM_ID": "10.213.0.10:9999",
        "HCCL_SOCKET_IFNAME": "ens32",
        "PT_HPU_LAZY_MODE": "1",
        "GC_KERNEL_PATH": "/usr/lib/habanalabs/libtpc_kernels.so",
        "HABANA_VISIBLE_MODULES": "0,1,2,3",
        "HABANA_LOGS": "/var/log/habana_logs/",
        "HLS_MODULE_ID": "0",
        "HBN_TPC_ENABLE": "1",
        "SYNAPSE_LOG_LEVEL": "4",
        "LD_LIBRARY_PATH": "/usr/lib/habanalabs",
        "PYTHONPATH": "/root/Model-References",
        "PATH": "/usr/bin:/bin",
        "HOME": "/root",
        "AWS_SECRET_ACCESS_KEY": "xyz",
        "MY_SETTING": "a",
        "MYSETTING": "b",
        "BASH_FUNC_hccl%%": "() { :; }",
        "HCCL_BAD-NAME": "x",
    }
    assert exported_names(env, ["MY_"]) == [
        "GC_KERNEL_PATH",
        "HABANA_LOGS",
        "HABANA_VISIBLE_MODULES",
        "HBN_TPC_ENABLE",
        "HCCL_COMM_ID",
        "HCCL_SOCKET_IFNAME",
        "HLS_MODULE_ID",
        "LD_LIBRARY_PATH",
        "MY_SETTING",
        "PT_HPU_LAZY_MODE",
        "PYTHONPATH",
        "SYNAPSE_LOG_LEVEL",
    ]


def test_exported_names_defaults_and_duplicates():
    env = {"PATH": "/bin", "HOME": "/root", "MY_X": "1", "HCCL_X": "1"}
    assert exported_names(env) == ["HCCL_X"]
    # duplicate / overlapping prefixes do not duplicate names
    assert exported_names(env, ["HCCL_", "H", "MY_", "MY_"]) == ["HCCL_X", "HOME", "MY_X"]
    assert exported_names({}) == []


def test_exported_names_export_names_only_when_set():
    assert exported_names({"PATH": "/bin"}) == []
    assert exported_names({"PYTHONPATH": ""}) == ["PYTHONPATH"]


def test_exported_names_empty_prefix_is_user_error():
    with pytest.raises(UserError) as info:
        exported_names({"PATH": "/bin"}, [""])
    assert info.value.where == "--export-prefix"
    assert info.value.hint


# ---------------------------------------------------------------- parse_ip_addr

# `ip -o addr show` on a DL1 node: loopback, primary ENI, docker bridge, a veth, an EFA-less
# second ENI, and a couple of lines that are not addresses.
DL1_A = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
1: lo    inet6 ::1/128 scope host \\       valid_lft forever preferred_lft forever
2: ens32    inet 10.213.0.10/24 brd 10.213.0.255 scope global dynamic ens32\\       valid_lft 3212sec preferred_lft 3212sec
2: ens32    inet6 fd00:10::a/64 scope global dynamic noprefixroute \\       valid_lft 443sec preferred_lft 443sec
2: ens32    inet6 fe80::8e2:5fff:fe3a:1b2c/64 scope link \\       valid_lft forever preferred_lft forever
3: docker0    inet 172.17.0.1/16 brd 172.17.255.255 scope global docker0\\       valid_lft forever preferred_lft forever
5: veth3f2a1b@if4    inet6 fe80::a8c1:abff:fe12:3456/64 scope link \\       valid_lft forever preferred_lft forever
6: ens5    inet 172.31.8.20/20 brd 172.31.15.255 scope global dynamic ens5\\       valid_lft 3400sec preferred_lft 3400sec
this is not an ip line
7: efa0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9001 qdisc mq state UP group default qlen 1000\\    link/ether 0a:1b:2c:3d:4e:5f brd ff:ff:ff:ff:ff:ff
8: tun0    inet 10.8.0.1 peer 10.8.0.2/32 scope global tun0\\       valid_lft forever preferred_lft forever
9: broken    inet not-an-address/24 scope global broken
"""

DL1_B = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
1: lo    inet6 ::1/128 scope host \\       valid_lft forever preferred_lft forever
2: ens32    inet 10.213.0.11/24 brd 10.213.0.255 scope global dynamic ens32\\       valid_lft 3100sec preferred_lft 3100sec
2: ens32    inet6 fd00:10::b/64 scope global dynamic noprefixroute \\       valid_lft 443sec preferred_lft 443sec
3: docker0    inet 172.17.0.1/16 brd 172.17.255.255 scope global docker0\\       valid_lft forever preferred_lft forever
6: ens5    inet 172.31.8.21/20 brd 172.31.15.255 scope global dynamic ens5\\       valid_lft 3400sec preferred_lft 3400sec
"""

# Same cluster, but host C's NIC on the 10.213.0.0/24 subnet is named eth0 (other AMI).
HOST_C_ETH0 = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
2: eth0    inet 10.213.0.12/24 brd 10.213.0.255 scope global eth0\\       valid_lft forever preferred_lft forever
3: docker0    inet 172.17.0.1/16 brd 172.17.255.255 scope global docker0\\       valid_lft forever preferred_lft forever
"""


def test_parse_ip_addr_realistic():
    got = parse_ip_addr(DL1_A)
    assert got == [
        Interface("lo", ["127.0.0.1/8", "::1/128"]),
        Interface("ens32", ["10.213.0.10/24", "fd00:10::a/64", "fe80::8e2:5fff:fe3a:1b2c/64"]),
        Interface("docker0", ["172.17.0.1/16"]),
        Interface("veth3f2a1b", ["fe80::a8c1:abff:fe12:3456/64"]),
        Interface("ens5", ["172.31.8.20/20"]),
        Interface("tun0", ["10.8.0.1/32"]),
    ]


def test_parse_ip_addr_groups_by_name_in_first_seen_order():
    text = (
        "3: b    inet 10.0.0.1/8 scope global b\n"
        "2: a    inet 10.1.0.1/16 scope global a\n"
        "3: b    inet6 fd00::1/64 scope global \n"
        "3: b    inet 10.0.0.1/8 scope global b\n"  # repeated line: no duplicate address
    )
    assert parse_ip_addr(text) == [Interface("b", ["10.0.0.1/8", "fd00::1/64"]), Interface("a", ["10.1.0.1/16"])]


def test_parse_ip_addr_ignores_garbage():
    assert parse_ip_addr("") == []
    assert parse_ip_addr("\n\nfoo bar baz qux\nx: eth0 inet 10.0.0.1/24\n2: eth0 inet6 10.0.0.1/24\n") == []


def test_parse_ip_addr_this_machine_format():
    # exact spacing of a real `ip -o addr show` line
    line = (
        "4: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever preferred_lft forever"
    )
    assert parse_ip_addr(line) == [Interface("eth0", ["192.0.2.2/24"])]


# ---------------------------------------------------------------- choose_interface


def ifs(*pairs) -> list[Interface]:
    return [Interface(name, list(addrs)) for name, addrs in pairs]


def test_choose_same_name_on_all_hosts_by_subnet():
    h = {"dl1-a": parse_ip_addr(DL1_A), "dl1-b": parse_ip_addr(DL1_B)}
    assert choose_interface("10.213.0.10", h) == ("ens32", "subnet")
    assert choose_interface("172.31.8.20", h) == ("ens5", "subnet")


def test_choose_common_name_when_hosts_have_different_extra_names():
    h = {
        "a": ifs(("lo", ["127.0.0.1/8"]), ("eth0", ["10.0.0.1/24"]), ("bond0", ["10.0.0.101/24"])),
        "b": ifs(("lo", ["127.0.0.1/8"]), ("bond0", ["10.0.0.102/24"])),
        "c": ifs(("bond0", ["10.0.0.103/24"]), ("ens6", ["10.0.0.203/24"])),
    }
    assert choose_interface("10.0.0.1", h) == ("bond0", "subnet")


def test_choose_prefers_real_nic_then_alphabetical():
    both = ifs(
        ("docker0", ["10.0.0.50/24"]), ("veth1", ["10.0.0.51/24"]), ("eth1", ["10.0.0.2/24"]), ("eth0", ["10.0.0.3/24"])
    )
    assert choose_interface("10.0.0.1", {"a": both, "b": both}) == ("eth0", "subnet")
    only_virtual = ifs(("virbr0", ["10.0.0.50/24"]), ("docker0", ["10.0.0.51/24"]))
    assert choose_interface("10.0.0.1", {"a": only_virtual}) == ("docker0", "subnet")


def test_choose_error_when_a_host_names_its_nic_differently():
    h = {"dl1-a": parse_ip_addr(DL1_A), "dl1-b": parse_ip_addr(DL1_B), "dl1-c": parse_ip_addr(HOST_C_ETH0)}
    with pytest.raises(UserError) as info:
        choose_interface("10.213.0.10", h)
    err = info.value
    assert err.where == "HCCL_SOCKET_IFNAME"
    assert err.hint == IFNAME_HINT
    assert "set HCCL_SOCKET_IFNAME (e.g. -x HCCL_SOCKET_IFNAME=eth0)" in str(err)
    msg = err.message
    assert "10.213.0.10" in msg
    lines = msg.splitlines()
    line_a = next(l for l in lines if l.strip().startswith("dl1-a:"))
    line_c = next(l for l in lines if l.strip().startswith("dl1-c:"))
    assert "ens32 10.213.0.10/24" in line_a and "(on the master's subnet)" in line_a
    assert "docker0 172.17.0.1/16" in line_a
    assert "eth0 10.213.0.12/24 (on the master's subnet)" in line_c
    assert any(l.strip().startswith("dl1-b:") and "10.213.0.11/24" in l for l in lines)


def test_choose_error_when_one_host_is_off_the_subnet():
    h = {"a": ifs(("eth0", ["10.0.0.1/24"])), "b": ifs(("eth0", ["10.9.0.1/24"]))}
    with pytest.raises(UserError) as info:
        choose_interface("10.0.0.1", h)
    assert info.value.where == "HCCL_SOCKET_IFNAME"
    assert "b has no interface on its subnet" in info.value.message
    assert "eth0 10.9.0.1/24" in info.value.message


def test_choose_ipv6_master():
    h = {"dl1-a": parse_ip_addr(DL1_A), "dl1-b": parse_ip_addr(DL1_B)}
    assert choose_interface("fd00:10::a", h) == ("ens32", "subnet")
    assert choose_interface("[fd00:10::b]", h) == ("ens32", "subnet")
    assert subnet_cidr("fd00:10::a", h["dl1-a"], "ens32") == "fd00:10::/64"


def test_choose_ipv4_mapped_master():
    h = {"dl1-a": parse_ip_addr(DL1_A), "dl1-b": parse_ip_addr(DL1_B)}
    assert choose_interface("::ffff:10.213.0.10", h) == ("ens32", "subnet")


def test_choose_loopback_master_single_host():
    h = {"localhost": parse_ip_addr(DL1_A)}
    assert choose_interface("127.0.0.1", h) == ("lo", "subnet")
    assert choose_interface("::1", h) == ("lo", "subnet")


def test_choose_fallback_when_no_host_on_subnet():
    h = {"dl1-a": parse_ip_addr(DL1_A), "dl1-b": parse_ip_addr(DL1_B)}
    # first name on the first host, other than lo*/docker*, that every host has
    assert choose_interface("54.201.33.7", h) == ("ens32", "fallback")
    order = ifs(
        ("lo", ["127.0.0.1/8"]),
        ("docker0", ["172.17.0.1/16"]),
        ("ens5", ["172.31.8.20/20"]),
        ("ens6", ["172.31.9.20/20"]),
    )
    other = ifs(
        ("docker0", ["172.17.0.1/16"]),
        ("ens6", ["172.31.9.21/20"]),
        ("ens5", ["172.31.8.21/20"]),
        ("lo", ["127.0.0.1/8"]),
    )
    assert choose_interface("54.201.33.7", {"a": order, "b": other}) == ("ens5", "fallback")


def test_choose_fallback_skips_names_missing_on_some_host():
    a = ifs(("lo", ["127.0.0.1/8"]), ("ens32", ["10.213.0.10/24"]), ("ens5", ["172.31.8.20/20"]))
    b = ifs(("lo", ["127.0.0.1/8"]), ("ens5", ["172.31.8.21/20"]))
    assert choose_interface("203.0.113.9", {"a": a, "b": b}) == ("ens5", "fallback")


def test_choose_fallback_error_when_nothing_common():
    a = ifs(("lo", ["127.0.0.1/8"]), ("docker0", ["172.17.0.1/16"]), ("ens32", ["10.213.0.10/24"]))
    b = ifs(("lo", ["127.0.0.1/8"]), ("docker0", ["172.17.0.1/16"]), ("eth0", ["10.213.1.10/24"]))
    with pytest.raises(UserError) as info:
        choose_interface("203.0.113.9", {"a": a, "b": b})
    assert info.value.where == "HCCL_SOCKET_IFNAME"
    assert info.value.hint == IFNAME_HINT
    assert "ens32 10.213.0.10/24" in info.value.message and "eth0 10.213.1.10/24" in info.value.message


def test_choose_rejects_non_ip_master():
    with pytest.raises(UserError) as info:
        choose_interface("dl1-a.example.com", {"a": parse_ip_addr(DL1_A)})
    assert info.value.where == "--master-addr"
    assert info.value.hint


def test_choose_needs_hosts():
    with pytest.raises(ValueError):
        choose_interface("10.0.0.1", {})


# ---------------------------------------------------------------- subnet_cidr


def test_subnet_cidr_values():
    a = parse_ip_addr(DL1_A)
    assert subnet_cidr("10.213.0.10", a, "ens32") == "10.213.0.0/24"
    assert subnet_cidr("10.213.0.200", a, "ens32") == "10.213.0.0/24"
    assert subnet_cidr("172.31.0.5", a, "ens5") == "172.31.0.0/20"
    assert subnet_cidr("127.0.0.1", a, "lo") == "127.0.0.0/8"
    assert subnet_cidr("10.213.0.10", a, "ens5") is None  # wrong interface
    assert subnet_cidr("10.214.0.10", a, "ens32") is None  # not on the subnet
    assert subnet_cidr("10.213.0.10", a, "nosuch") is None
    assert subnet_cidr("10.213.0.10", [], "ens32") is None


def test_subnet_cidr_narrowest_match():
    iface = ifs(("eth0", ["10.0.0.1/8", "10.1.2.3/24"]))
    assert subnet_cidr("10.1.2.99", iface, "eth0") == "10.1.2.0/24"


# ---------------------------------------------------------------- efa_present


def no_fi_info(monkeypatch):
    monkeypatch.setattr(fabric.shutil, "which", lambda name: None)


def test_efa_present_sysfs(tmp_path, monkeypatch):
    no_fi_info(monkeypatch)
    ib = tmp_path / "sys" / "class" / "infiniband"
    ib.mkdir(parents=True)
    assert efa_present(str(tmp_path)) is False
    (ib / "mlx5_0").mkdir()
    assert efa_present(str(tmp_path)) is False
    (ib / "efa_0").mkdir()
    assert efa_present(str(tmp_path)) is True


def test_efa_present_rdmap_name(tmp_path, monkeypatch):
    no_fi_info(monkeypatch)
    ib = tmp_path / "sys" / "class" / "infiniband"
    ib.mkdir(parents=True)
    (ib / "rdmap16s27").mkdir()
    assert efa_present(str(tmp_path)) is True


def test_efa_present_missing_sysfs(tmp_path, monkeypatch):
    no_fi_info(monkeypatch)
    assert efa_present(str(tmp_path)) is False
    assert efa_present(str(tmp_path / "nope")) is False


def test_efa_present_fi_info(tmp_path, monkeypatch):
    monkeypatch.setattr(
        fabric.shutil, "which", lambda name: "/opt/amazon/efa/bin/fi_info" if name == "fi_info" else None
    )
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    assert efa_present(str(tmp_path), run=fake_run) is True
    assert calls == [["/opt/amazon/efa/bin/fi_info", "-p", "efa"]]

    assert efa_present(str(tmp_path), run=lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1)) is False


def test_efa_present_never_raises(tmp_path, monkeypatch):
    monkeypatch.setattr(fabric.shutil, "which", lambda name: "/usr/bin/fi_info")

    def boom(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, 15)

    assert efa_present(str(tmp_path), run=boom) is False

    def oserror(cmd, **kw):
        raise PermissionError("denied")

    assert efa_present(str(tmp_path), run=oserror) is False
    assert efa_present("\0bad", run=oserror) is False


# ---------------------------------------------------------------- efa_env

AMZ = ":".join(AMAZON_LIBS)


def test_efa_env_prefixes_in_order():
    base = {"LD_LIBRARY_PATH": "/usr/lib/habanalabs:/usr/local/lib"}
    assert efa_env(base) == {
        "HCCL_OVER_OFI": "1",
        "LD_LIBRARY_PATH": f"{DEFAULT_OFI_WRAPPER}:{AMZ}:/usr/lib/habanalabs:/usr/local/lib",
    }


def test_efa_env_wrapper_choice():
    assert efa_env({"HCCL_OFI_WRAPPER": "/opt/w"})["LD_LIBRARY_PATH"] == f"/opt/w:{AMZ}"
    assert efa_env({"HCCL_OFI_WRAPPER": "/opt/w"}, "/arg/w")["LD_LIBRARY_PATH"] == f"/arg/w:{AMZ}"
    assert efa_env({}, None)["LD_LIBRARY_PATH"] == f"{DEFAULT_OFI_WRAPPER}:{AMZ}"


def test_efa_env_no_duplicates_and_idempotent():
    base = {"LD_LIBRARY_PATH": "/opt/amazon/efa/lib/:/usr/lib/habanalabs:/root/hccl_ofi_wrapper"}
    once = efa_env(base)
    assert once["LD_LIBRARY_PATH"] == f"{DEFAULT_OFI_WRAPPER}:{AMZ}:/usr/lib/habanalabs"
    twice = efa_env({**base, **once})
    assert twice == {"LD_LIBRARY_PATH": once["LD_LIBRARY_PATH"]}  # HCCL_OVER_OFI already set by then
    assert {**base, **once, **twice} == {**base, **once}


@pytest.mark.parametrize("ld", [None, "", ":", "::", "/a::/b", ":/a:", "/a:::"])
def test_efa_env_no_empty_entries(ld):
    base = {} if ld is None else {"LD_LIBRARY_PATH": ld}
    value = efa_env(base)["LD_LIBRARY_PATH"]
    assert "" not in value.split(":")
    tail = [e for e in (ld or "").split(":") if e]
    assert value.split(":") == [DEFAULT_OFI_WRAPPER, *AMAZON_LIBS, *tail]


def test_efa_env_keeps_users_hccl_over_ofi():
    assert "HCCL_OVER_OFI" not in efa_env({"HCCL_OVER_OFI": "0"})
    assert efa_env({"HCCL_OVER_OFI": ""})["HCCL_OVER_OFI"] == "1"


def test_efa_env_is_pure():
    base = {"LD_LIBRARY_PATH": "/x"}
    efa_env(base)
    assert base == {"LD_LIBRARY_PATH": "/x"}


@settings(max_examples=300, deadline=None)
@given(
    ld=st.text(alphabet=st.characters(blacklist_characters="\0"), max_size=60),
    wrapper=st.one_of(st.none(), st.text(alphabet=st.characters(blacklist_characters="\0:"), max_size=12)),
)
def test_efa_env_property_no_empty_entry_and_idempotent(ld, wrapper):
    base = {"LD_LIBRARY_PATH": ld}
    once = efa_env(base, wrapper)
    entries = once["LD_LIBRARY_PATH"].split(":")
    assert "" not in entries
    assert entries[0] == (wrapper or DEFAULT_OFI_WRAPPER)
    assert all(any(e.rstrip("/") == lib for e in entries) for lib in AMAZON_LIBS)
    again = efa_env({**base, **once}, wrapper)
    assert again["LD_LIBRARY_PATH"] == once["LD_LIBRARY_PATH"]
    # every non-empty original entry survives (possibly as an earlier duplicate)
    keys = {e.rstrip("/") or "/" for e in entries}
    assert all((e.rstrip("/") or "/") in keys for e in ld.split(":") if e)


# ---------------------------------------------------------------- fabric_env


def test_fabric_env_users_ifname_wins():
    base = {"HCCL_SOCKET_IFNAME": "bond0", "LD_LIBRARY_PATH": "/usr/lib/habanalabs"}
    assert fabric_env(base, efa=False, ifname="ens32") == {
        "GLOO_SOCKET_IFNAME": "ens32",
        "NCCL_SOCKET_IFNAME": "ens32",
    }


def test_fabric_env_gaudi_nic_scale_out_sets_no_ofi():
    env = fabric_env({}, efa=False, ifname="eth0")
    assert env == {"HCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}
    assert "HCCL_OVER_OFI" not in env and "LD_LIBRARY_PATH" not in env
    assert fabric_env({}, efa=False, ifname=None) == {}


def test_fabric_env_efa_and_ifname():
    env = fabric_env({"LD_LIBRARY_PATH": "/usr/lib/habanalabs"}, efa=True, ifname="ens32", wrapper_dir="/w")
    assert env == {
        "HCCL_OVER_OFI": "1",
        "LD_LIBRARY_PATH": f"/w:{AMZ}:/usr/lib/habanalabs",
        "HCCL_SOCKET_IFNAME": "ens32",
        "GLOO_SOCKET_IFNAME": "ens32",
        "NCCL_SOCKET_IFNAME": "ens32",
    }


def test_fabric_env_efa_without_ifname():
    assert fabric_env({"HCCL_OVER_OFI": "1"}, efa=True, ifname=None) == {
        "LD_LIBRARY_PATH": f"{DEFAULT_OFI_WRAPPER}:{AMZ}"
    }
