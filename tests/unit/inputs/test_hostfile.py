"""Tests for gaudi_launch.inputs.hostfile: parsing hostfiles, selectors and host selection."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.hostfile import Host, parse_hostfile, read_hostfile
from gaudi_launch.inputs.hostselect import parse_selector, select

SRC = "hosts.txt"


def parse_error(text: str, source: str = SRC) -> UserError:
    with pytest.raises(UserError) as info:
        parse_hostfile(text, source)
    return info.value


def select_error(hosts, **kwargs) -> UserError:
    with pytest.raises(UserError) as info:
        select(hosts, **kwargs)
    return info.value


def selector_error(expr: str, option: str = "--include") -> UserError:
    with pytest.raises(UserError) as info:
        parse_selector(expr, option)
    return info.value


# --------------------------------------------------------------------------- parse_hostfile


class TestParseHostfile:
    def test_simple(self):
        hosts = parse_hostfile("worker-0 slots=8\nworker-1 slots=4\n", SRC)
        assert hosts == [Host("worker-0", 8, 1), Host("worker-1", 4, 2)]

    def test_comments_blank_lines_and_whitespace(self):
        text = (
            "# cluster A\n"
            "\n"
            "   \n"
            "  worker-0   slots=8   \n"
            "\tworker-1\tslots=2  # rack 3\n"
            "# worker-2 slots=8\n"
            "worker-3 slots=1# no space before comment\n"
            "    # indented comment\n"
        )
        hosts = parse_hostfile(text, SRC)
        assert hosts == [Host("worker-0", 8, 4), Host("worker-1", 2, 5), Host("worker-3", 1, 7)]

    def test_crlf_line_endings(self):
        hosts = parse_hostfile("a slots=1\r\nb slots=2\r\n", SRC)
        assert hosts == [Host("a", 1, 1), Host("b", 2, 2)]

    def test_no_trailing_newline(self):
        assert parse_hostfile("a slots=3", SRC) == [Host("a", 3, 1)]

    def test_address_forms(self):
        text = (
            "10.0.0.7 slots=4\n"
            "fe80::1 slots=8\n"
            "[2001:db8::2] slots=2\n"
            "deploy@worker-0 slots=8\n"
            "root@10.0.0.8 slots=1\n"
            "ubuntu@[fe80::3] slots=2\n"
            "node.example.com slots=8\n"
            "under_score slots=1\n"
        )
        hosts = parse_hostfile(text, SRC)
        assert [(h.name, h.slots, h.line) for h in hosts] == [
            ("10.0.0.7", 4, 1),
            ("fe80::1", 8, 2),
            ("2001:db8::2", 2, 3),
            ("deploy@worker-0", 8, 4),
            ("root@10.0.0.8", 1, 5),
            ("ubuntu@fe80::3", 2, 6),
            ("node.example.com", 8, 7),
            ("under_score", 1, 8),
        ]

    def test_host_is_frozen_with_default_line(self):
        host = Host("a", 2)
        assert host.line == 0
        with pytest.raises(Exception):
            host.slots = 3  # type: ignore[misc]

    def test_large_slot_count(self):
        assert parse_hostfile("a slots=64", SRC)[0].slots == 64


class TestParseHostfileErrors:
    def test_missing_slots(self):
        err = parse_error("a slots=1\nworker-1\n")
        assert err.where == f"{SRC}:2"
        assert "missing slots" in err.message and "worker-1" in err.message
        assert "worker-1 slots=" in err.hint

    @pytest.mark.parametrize("value", ["abc", "", "-1", "1.5", "+2", "0x10", "٣"])
    def test_slots_not_a_positive_integer(self, value):
        err = parse_error(f"a slots=1\n\nb slots={value}\n")
        assert err.where == f"{SRC}:3"
        assert "slots must be a positive integer" in err.message
        assert repr(value) in err.message or f"'{value}'" in err.message
        assert "slots=8" in err.hint

    @pytest.mark.parametrize("value", ["0", "00"])
    def test_slots_zero(self, value):
        err = parse_error(f"a slots={value}")
        assert err.where == f"{SRC}:1"
        assert "slots must be at least 1" in err.message
        assert err.hint

    def test_slots_twice(self):
        err = parse_error("a slots=2 slots=2")
        assert err.where == f"{SRC}:1"
        assert "slots is given twice" in err.message
        assert "a slots=2" in err.hint

    def test_unknown_key(self):
        err = parse_error("a slots=2\nb slots=2 gpus=4")
        assert err.where == f"{SRC}:2"
        assert err.message == "unknown key 'gpus' (only slots=N is understood)"
        assert "b slots=N" in err.hint

    def test_unknown_key_wrong_case(self):
        err = parse_error("a Slots=2")
        assert err.message == "unknown key 'Slots' (only slots=N is understood)"
        assert "lower-case" in err.hint

    def test_slots_without_host(self):
        err = parse_error("a slots=1\n  slots=2  # oops\n")
        assert err.where == f"{SRC}:2"
        assert "expected a host name before 'slots=2'" in err.message
        assert "worker-0 slots=8" in err.hint

    def test_bare_number_after_host(self):
        err = parse_error("worker-0 8")
        assert err.where == f"{SRC}:1"
        assert "unexpected '8'" in err.message
        assert err.hint == "write 'worker-0 slots=8'"

    def test_spaces_around_equals(self):
        err = parse_error("worker-0 slots = 8")
        assert err.where == f"{SRC}:1"
        assert "unexpected 'slots'" in err.message
        assert "no spaces around '='" in err.hint

    def test_duplicate_host_names_first_line(self):
        err = parse_error("# header\nworker-0 slots=8\nworker-1 slots=8\nworker-0 slots=4\n")
        assert err.where == f"{SRC}:4"
        assert "duplicate host 'worker-0'" in err.message
        assert "line 2" in err.message
        assert err.hint

    @pytest.mark.parametrize(
        "first, second",
        [
            ("Worker-0", "worker-0"),  # host names are case-insensitive
            ("alice@worker-0", "bob@worker-0"),  # same machine, different user
            ("fe80::1", "[fe80:0:0::1]"),  # same IPv6 address, spelled differently
        ],
    )
    def test_duplicate_same_machine(self, first, second):
        err = parse_error(f"{first} slots=1\n{second} slots=1\n")
        assert err.where == f"{SRC}:2"
        assert "duplicate host" in err.message and "line 1" in err.message

    @pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n   # another\n", "  \t \n"])
    def test_empty_file(self, text):
        err = parse_error(text)
        assert err.where == SRC
        assert "no hosts" in err.message
        assert "slots=" in err.hint

    @pytest.mark.parametrize(
        "name, fragment, hint_fragment",
        [
            ("host:22", "unexpected ':'", "port"),
            ("a:b:c", "unexpected ':'", "IPv6"),
            ("a@b@c", "'@' appears more than once", "user@host"),
            ("a,b", "cannot contain ','", "one host per line"),
            ("[worker-0]", "brackets are only for IPv6", "[fe80::1]"),
            ("[fe80::1", "brackets are only for IPv6", "[fe80::1]"),
            ("[10.0.0.1]", "brackets are only for IPv6", "without brackets"),
            ("999.0.0.1", "not a valid IPv4 address", "0-255"),
            ("10.0.0", "not a valid IPv4 address", "four numbers"),
            ("-oProxyCommand", "bad host name", "must not start with '-'"),
            ("wörker", "bad host name", "letters, digits"),
            ("a/b", "bad host name", "letters, digits"),
            ("user@", "nothing after '@'", "user@host"),
            ("@host", "nothing before '@'", "user@host"),
            ("us er@host", None, None),  # split into tokens: 'er@host' is not key=value
            ("bad!user@host", "bad user name 'bad!user'", "user@host"),
        ],
    )
    def test_bad_host_names(self, name, fragment, hint_fragment):
        err = parse_error(f"ok slots=1\n{name} slots=2\n")
        assert err.where == f"{SRC}:2"
        if fragment:
            assert fragment in err.message
            assert name in err.message or name.split("@")[0] in err.message
        if hint_fragment:
            assert hint_fragment in err.hint

    def test_host_with_equals(self):
        err = parse_error("a=b slots=1")
        assert err.where == f"{SRC}:1"
        assert "expected a host name" in err.message

    def test_str_of_error_is_friendly(self):
        err = parse_error("a slots=1\na slots=1")
        text = str(err)
        assert text.startswith(f"{SRC}:2: duplicate host 'a'")
        assert "\n  hint: " in text

    def test_source_used_verbatim(self):
        err = parse_error("a slots=x", source="/etc/gaudi/hostfile")
        assert err.where == "/etc/gaudi/hostfile:1"


# --------------------------------------------------------------------------- read_hostfile


class TestReadHostfile:
    def test_reads_file(self, tmp_path):
        path = tmp_path / "hostfile"
        path.write_text("# hosts\nworker-0 slots=8\nworker-1 slots=8 # spare\n", encoding="utf-8")
        assert read_hostfile(str(path)) == [Host("worker-0", 8, 2), Host("worker-1", 8, 3)]

    def test_errors_name_the_path_and_line(self, tmp_path):
        path = tmp_path / "hostfile"
        path.write_text("worker-0 slots=8\nworker-1 slots=zero\n", encoding="utf-8")
        with pytest.raises(UserError) as info:
            read_hostfile(str(path))
        assert info.value.where == f"{path}:2"

    def test_missing_file(self, tmp_path):
        path = str(tmp_path / "nope")
        with pytest.raises(UserError) as info:
            read_hostfile(path)
        assert info.value.where == path
        assert "not found" in info.value.message
        assert "--hostfile" in info.value.hint

    def test_directory(self, tmp_path):
        with pytest.raises(UserError) as info:
            read_hostfile(str(tmp_path))
        assert info.value.where == str(tmp_path)
        assert "directory" in info.value.message
        assert info.value.hint

    def test_empty_file(self, tmp_path):
        path = tmp_path / "hostfile"
        path.write_text("", encoding="utf-8")
        with pytest.raises(UserError) as info:
            read_hostfile(str(path))
        assert info.value.where == str(path)
        assert "no hosts" in info.value.message

    def test_not_utf8(self, tmp_path):
        path = tmp_path / "hostfile"
        path.write_bytes(b"worker-0 slots=8\n\xff\xfe\n")
        with pytest.raises(UserError) as info:
            read_hostfile(str(path))
        assert info.value.where == str(path)
        assert "UTF-8" in info.value.message

    def test_unreadable(self, tmp_path, monkeypatch):
        # Tests run as root (CI too), which reads anything: fake the permission error instead.
        import gaudi_launch.inputs.hostfile as hostfile_module

        path = tmp_path / "hostfile"
        path.write_text("a slots=1\n", encoding="utf-8")

        def denied(*_a, **_k):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(hostfile_module, "read_bounded", denied)
        with pytest.raises(UserError) as info:
            read_hostfile(str(path))
        assert info.value.where == str(path)
        assert "permission denied" in info.value.message
        assert info.value.hint


# --------------------------------------------------------------------------- parse_selector


class TestParseSelector:
    @pytest.mark.parametrize(
        "expr, expected",
        [
            ("worker-0", {"worker-0": None}),
            ("worker-0:0", {"worker-0": [0]}),
            ("worker-0:0,2@worker-1", {"worker-0": [0, 2], "worker-1": None}),
            ("worker-0:3,1,2", {"worker-0": [1, 2, 3]}),
            ("a@b@c:7", {"a": None, "b": None, "c": [7]}),
            ("10.0.0.1:1", {"10.0.0.1": [1]}),
            ("[fe80::1]:0,1", {"fe80::1": [0, 1]}),
            ("[fe80::1]", {"fe80::1": None}),
            ("fe80::1", {"fe80::1": None}),
            ("fe80::1@worker-0:1", {"fe80::1": None, "worker-0": [1]}),
            (" worker-0 : 0 , 1 @ worker-1 ", {"worker-0": [0, 1], "worker-1": None}),
            # Named twice: merged, as DeepSpeed's parse_node_config_list does.
            ("a:0,1,0", {"a": [0, 1]}),
            ("a:2@b@a:0,2", {"a": [0, 2], "b": None}),
            ("A@a", {"A": None}),
            ("[fe80::1]@fe80:0::1", {"fe80::1": None}),
        ],
    )
    def test_valid(self, expr, expected):
        result = parse_selector(expr, "--include")
        assert result == expected
        assert list(result) == list(expected)  # order as written

    @pytest.mark.parametrize(
        "expr, fragment",
        [
            ("", "empty host"),
            ("a@", "empty host"),
            ("@a", "empty host"),
            ("a@@b", "empty host"),
            (":0", "missing host name"),
            ("a:", "empty slot number"),
            ("a:0,,1", "empty slot number"),
            ("a:0,", "empty slot number"),
            ("a:x", "slot 'x' in 'a:x' is not a number"),
            ("a:1.5", "is not a number"),
            ("a:-1", "cannot be negative"),
            ("a@b:1@a:2", "host 'a' is named both whole and with slots"),
            ("a:2@A", "named both whole and with slots"),
            ("[fe80::1:0", "missing ']'"),
            ("[worker-0]:1", "not an IPv6 address"),
            ("[fe80::1]0", "unexpected '0' after ']'"),
            ("fe80::1:zz:0", "not an IPv6 address"),
            ("a,b", "bad host name 'a,b'"),
            ("a=b", "bad host name"),
        ],
    )
    def test_errors(self, expr, fragment):
        err = selector_error(expr, "--exclude")
        assert err.where == "--exclude"
        assert fragment in err.message
        assert err.hint

    def test_comma_between_hosts_hint(self):
        err = selector_error("worker-0,worker-1")
        assert "worker-0@worker-1" in err.hint


# --------------------------------------------------------------------------- select


HOSTS = [Host("worker-0", 4, 1), Host("deploy@worker-1", 2, 2), Host("fe80::1", 2, 3), Host("worker-3", 8, 5)]


class TestSelect:
    def test_all(self):
        assert select(HOSTS) == [
            ("worker-0", [0, 1, 2, 3]),
            ("deploy@worker-1", [0, 1]),
            ("fe80::1", [0, 1]),
            ("worker-3", list(range(8))),
        ]

    def test_include_hostfile_order_and_sorted_slots(self):
        result = select(HOSTS, include="worker-3:5,1@worker-0:2")
        assert result == [("worker-0", [2]), ("worker-3", [1, 5])]

    def test_include_whole_host_and_user_prefix(self):
        # '@' separates hosts in a selector, so a user@host entry is named by its host part
        assert select(HOSTS, include="worker-1") == [("deploy@worker-1", [0, 1])]

    def test_include_ipv6(self):
        assert select(HOSTS, include="[fe80::1]:1") == [("fe80::1", [1])]
        assert select(HOSTS, include="fe80:0::1") == [("fe80::1", [0, 1])]

    def test_include_case_insensitive(self):
        assert select(HOSTS, include="WORKER-0:1") == [("worker-0", [1])]

    def test_exclude_hosts_and_slots(self):
        result = select(HOSTS, exclude="worker-0@worker-3:0,7@[fe80::1]:0")
        assert result == [
            ("deploy@worker-1", [0, 1]),
            ("fe80::1", [1]),
            ("worker-3", [1, 2, 3, 4, 5, 6]),
        ]

    def test_exclude_every_slot_drops_host(self):
        result = select(HOSTS, exclude="worker-1:0,1")
        assert [name for name, _ in result] == ["worker-0", "fe80::1", "worker-3"]

    def test_exclude_everything(self):
        err = select_error(HOSTS, exclude="worker-0@worker-1@fe80::1@worker-3:0,1,2,3,4,5,6,7")
        assert err.where == "--exclude"
        assert "no hosts" in err.message
        assert err.hint

    def test_include_and_exclude(self):
        err = select_error(HOSTS, include="worker-0", exclude="worker-1")
        assert err.where == "--include/--exclude"
        assert "mutually exclusive" in err.message
        assert err.hint

    @pytest.mark.parametrize("option", ["include", "exclude"])
    def test_unknown_host(self, option):
        err = select_error(HOSTS, **{option: "worker-0@worker-9:1"})
        assert err.where == f"--{option}"
        assert err.message == "Hostname 'worker-9' not found in hostfile"
        assert "worker-0" in err.hint and "deploy@worker-1" in err.hint and "fe80::1" in err.hint

    @pytest.mark.parametrize("option", ["include", "exclude"])
    def test_slot_out_of_range(self, option):
        err = select_error(HOSTS, **{option: "worker-1:0,2"})
        assert err.where == f"--{option}"
        assert err.message == "No slot 2 on host 'deploy@worker-1' (slots=2)"
        assert "0 to 1" in err.hint

    def test_selector_errors_carry_option(self):
        assert select_error(HOSTS, include="worker-0:x").where == "--include"
        assert select_error(HOSTS, exclude="").where == "--exclude"

    def test_known_hosts_hint_is_truncated(self):
        many = [Host(f"n{i}", 1, i + 1) for i in range(25)]
        err = select_error(many, include="zz")
        assert "n9" in err.hint and "n10" not in err.hint and "15 more" in err.hint

    def test_num_nodes(self):
        assert select(HOSTS, num_nodes=2) == [("worker-0", [0, 1, 2, 3]), ("deploy@worker-1", [0, 1])]
        assert len(select(HOSTS, num_nodes=4)) == 4

    def test_num_nodes_after_exclude(self):
        assert select(HOSTS, exclude="worker-0", num_nodes=1) == [("deploy@worker-1", [0, 1])]

    def test_num_nodes_too_many(self):
        err = select_error(HOSTS, include="worker-0@worker-3", num_nodes=3)
        assert err.where == "--num_nodes"
        assert err.message == "asked for 3 nodes but the hostfile selection has 2"
        assert "--num_nodes 2" in err.hint

    @pytest.mark.parametrize("value", [0, -1, True, 1.5])
    def test_num_nodes_invalid(self, value):
        err = select_error(HOSTS, num_nodes=value)
        assert err.where == "--num_nodes"
        assert "at least 1" in err.message

    def test_num_devices(self):
        result = select(HOSTS, num_devices=2)
        assert result == [
            ("worker-0", [0, 1]),
            ("deploy@worker-1", [0, 1]),
            ("fe80::1", [0, 1]),
            ("worker-3", [0, 1]),
        ]

    def test_num_devices_uses_selected_slots(self):
        result = select(HOSTS, include="worker-3:7,2,5", num_devices=2)
        assert result == [("worker-3", [2, 5])]

    def test_num_devices_too_many(self):
        err = select_error(HOSTS, exclude="worker-3:1", num_devices=3)
        assert err.where == "--num_devices"
        assert "deploy@worker-1" in err.message
        assert "slots 0,1" in err.message
        assert "--num_devices 2" in err.hint

    def test_num_devices_checked_after_num_nodes(self):
        # worker-1 has only 2 slots, but num_nodes=1 keeps just worker-0
        assert select(HOSTS, num_nodes=1, num_devices=4) == [("worker-0", [0, 1, 2, 3])]

    @pytest.mark.parametrize("value", [0, -3])
    def test_num_devices_invalid(self, value):
        err = select_error(HOSTS, num_devices=value)
        assert err.where == "--num_devices"
        assert "at least 1" in err.message

    def test_no_hosts(self):
        err = select_error([])
        assert err.where
        assert err.hint

    def test_does_not_mutate_input(self):
        hosts = list(HOSTS)
        select(hosts, exclude="worker-0:1", num_devices=1)
        assert hosts == HOSTS

    def test_end_to_end(self):
        hosts = parse_hostfile(
            "# training pool\nworker-0 slots=8\nroot@10.0.0.2 slots=8  # spare\n[fe80::9] slots=8\n", SRC
        )
        assert select(hosts, include="10.0.0.2:0,1@[fe80::9]:6,7") == [
            ("root@10.0.0.2", [0, 1]),
            ("fe80::9", [6, 7]),
        ]


# --------------------------------------------------------------------------- property test


_TOKENS = [
    "worker-0",
    "worker-1",
    "WORKER-0",
    "10.0.0.1",
    "999.1.1.1",
    "fe80::1",
    "[fe80::1]",
    "[fe80::1",
    "u@worker-0",
    "u@[fe80::1]",
    "a@b@c",
    "host:22",
    "@",
    "[]",
    "-x",
    "slots=1",
    "slots=8",
    "slots=0",
    "slots=",
    "slots=-1",
    "slots=x",
    "slots=1e3",
    "Slots=2",
    "gpus=1",
    "=",
    "=1",
    "#",
    "# comment",
    "slots",
    "8",
    ",",
    "a,b",
    "\t",
    "\r",
    "٣",
    "é",
]

_line_from_tokens = st.lists(st.sampled_from(_TOKENS), max_size=5).map(" ".join)
_lines = st.lists(st.one_of(st.text(max_size=30), _line_from_tokens), max_size=8)
_WHERE_RE = re.compile(r"^" + re.escape(SRC) + r":[1-9][0-9]*$")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_lines)
def test_parse_hostfile_only_raises_user_error(lines):
    text = "\n".join(lines)
    try:
        hosts = parse_hostfile(text, SRC)
    except UserError as err:
        assert err.where == SRC or _WHERE_RE.match(err.where), err.where
        assert err.message and err.hint
        if err.where != SRC:
            line = int(err.where.rsplit(":", 1)[1])
            assert 1 <= line <= max(1, text.count("\n") + 1)
    else:
        assert hosts
        lines_seen = [h.line for h in hosts]
        assert lines_seen == sorted(set(lines_seen))
        for host in hosts:
            assert isinstance(host.slots, int) and host.slots >= 1
            assert host.name and "[" not in host.name and "=" not in host.name
