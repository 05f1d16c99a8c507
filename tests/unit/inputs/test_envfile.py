from __future__ import annotations

import os
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gaudi_launch.errors import UserError
from gaudi_launch.inputs.envfile import (
    DEFAULT_NAME,
    is_secret,
    load_env_files,
    mask_env,
    mask_text,
    parse_assignments,
    parse_env_text,
    straddling,
)


def parse(text: str) -> dict[str, str]:
    return parse_env_text(text, "env")


def parse_error(text: str) -> UserError:
    with pytest.raises(UserError) as info:
        parse_env_text(text, "f.env")
    assert info.value.hint
    return info.value


# ---------------------------------------------------------------- parse_env_text: syntax


def test_basic_blank_lines_and_comments():
    text = "\n# comment\n   # indented comment\nA=1\n\n   \nB=two\n"
    assert parse(text) == {"A": "1", "B": "two"}


def test_empty_text():
    assert parse("") == {}
    assert parse("\n\n# only comments\n") == {}


def test_export_prefix():
    assert parse("export A=1\nexport\tB=2\n  export   C = 3") == {"A": "1", "B": "2", "C": "3"}


def test_export_as_a_name():
    assert parse("export=1\nexporter=2") == {"export": "1", "exporter": "2"}


def test_split_on_first_equals():
    assert parse("A=b=c==d\nB==x") == {"A": "b=c==d", "B": "=x"}


def test_empty_values():
    assert parse("A=\nB=''\nC=\"\"\nD=   \nE= # just a comment") == {"A": "", "B": "", "C": "", "D": "", "E": ""}


def test_whitespace_around_name_and_unquoted_value_stripped():
    assert parse("  A  =  hello world  \n\tB\t=\tx\t") == {"A": "hello world", "B": "x"}


def test_trailing_comment_on_unquoted_value():
    assert parse("A=1 # one\nB=2\t# two\nC=x  #") == {"A": "1", "B": "2", "C": "x"}


def test_hash_without_preceding_whitespace_is_value():
    assert parse("URL=http://x/#frag\nB=a#b #c\nC=#x") == {"URL": "http://x/#frag", "B": "a#b", "C": "#x"}


def test_single_quotes_literal():
    text = r"""A='  spaced  '
B='back\slash \n \" $HOME'
C='say "hi"'
D='# not a comment'"""
    assert parse(text) == {
        "A": "  spaced  ",
        "B": r"back\slash \n \" $HOME",
        "C": 'say "hi"',
        "D": "# not a comment",
    }


def test_double_quote_escapes():
    text = r'A="a\\b\"c\nd\te\$f"'
    assert parse(text) == {"A": 'a\\b"c\nd\te$f'}


def test_double_quote_unknown_escapes_kept():
    text = r'A="\x \a \` \0 \'"'
    assert parse(text) == {"A": r"\x \a \` \0 \'"}


def test_double_quotes_keep_spaces_and_hash():
    assert parse('A="  x # y  "') == {"A": "  x # y  "}


def test_comment_after_closing_quote():
    assert parse("A='x' # c\nB=\"y\"#c\nC='z'   \t") == {"A": "x", "B": "y", "C": "z"}


def test_whitespace_before_opening_quote():
    assert parse("A=   'x y'") == {"A": "x y"}


def test_quote_inside_unquoted_value_is_literal():
    assert parse("A=it's\nB=a\"b") == {"A": "it's", "B": 'a"b'}


def test_duplicate_later_wins():
    assert parse("A=1\nB=2\nA=3") == {"A": "3", "B": "2"}


def test_crlf_line_endings():
    assert parse("A=1\r\nB='two'\r\n# c\r\nC=\"3\" # c\r\n") == {"A": "1", "B": "two", "C": "3"}


def test_utf8_bom():
    assert parse("\ufeffA=1\nB=2") == {"A": "1", "B": "2"}


def test_no_variable_expansion():
    text = """A=$HOME
B="$HOME ${USER} $(whoami) `id`"
C='$(rm -rf /)'
D=`date`
E=a;b && c | d > e"""
    assert parse(text) == {
        "A": "$HOME",
        "B": "$HOME ${USER} $(whoami) `id`",
        "C": "$(rm -rf /)",
        "D": "`date`",
        "E": "a;b && c | d > e",
    }


def test_json_values_byte_exact():
    text = """J='{"a": [1, 2], "b": {"c": "d=e"}}'
K={"x":1}"""
    assert parse(text) == {"J": '{"a": [1, 2], "b": {"c": "d=e"}}', "K": '{"x":1}'}


def test_unicode_values():
    text = "A=héllo wörld ✓\nB='日本語 テキスト'\nC=\"emoji 🚀\"\nD=a\u00a0b\u2028c"
    assert parse(text) == {
        "A": "héllo wörld ✓",
        "B": "日本語 テキスト",
        "C": "emoji 🚀",
        "D": "a\u00a0b\u2028c",
    }


def test_name_rules():
    assert parse("_=1\n_A1=2\na_b=3") == {"_": "1", "_A1": "2", "a_b": "3"}


# ---------------------------------------------------------------- parse_env_text: errors


def test_error_no_equals():
    err = parse_error("A=1\n\nJUST_A_NAME\n")
    assert err.where == "f.env:3"
    assert "JUST_A_NAME" in err.message


def test_error_export_without_value():
    err = parse_error("export FOO")
    assert err.where == "f.env:1"


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A.B", "A B", "ÄB", "$A", "A$"])
def test_error_invalid_name(name):
    err = parse_error(f"# c\n{name}=1")
    assert err.where == "f.env:2"
    assert repr(name) in err.message


def test_error_missing_name():
    err = parse_error("=value")
    assert err.where == "f.env:1"
    assert "name" in err.message


@pytest.mark.parametrize("line", ["A='abc", 'A="abc', 'A="abc\\"', "A='", 'A="'])
def test_error_unterminated_quote(line):
    err = parse_error(f"X=1\n{line}\nB=2'")
    assert err.where == "f.env:2"
    assert "unterminated" in err.message


def test_error_multiline_quote_not_supported():
    err = parse_error("A='line one\nline two'")
    assert err.where == "f.env:1"


@pytest.mark.parametrize("line", ["A='x'y", 'A="x" y', "A='x''y'", "A='a' 'b'"])
def test_error_junk_after_closing_quote(line):
    err = parse_error(f"\n\n{line}")
    assert err.where == "f.env:3"
    assert "after the closing quote" in err.message


def test_error_nul_character():
    err = parse_error("A=a\0b")
    assert err.where == "f.env:1"


def test_error_line_numbers_with_crlf_and_bom():
    err = parse_error("\ufeffA=1\r\n\r\nbad line\r\n")
    assert err.where == "f.env:3"


def test_error_str_format():
    err = parse_error("oops")
    assert str(err).startswith("f.env:1: ")
    assert "\n  hint: " in str(err)


# ---------------------------------------------------------------- load_env_files


def write(path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.fixture
def dirs(tmp_path):
    home = tmp_path / "home"
    cwd = tmp_path / "work"
    home.mkdir()
    cwd.mkdir()
    return home, cwd


def load(home, cwd, **kw):
    kw.setdefault("environ", {})
    return load_env_files(home=str(home), cwd=str(cwd), **kw)


def test_no_files(dirs):
    home, cwd = dirs
    assert load(home, cwd) == ({}, [])


def test_home_only(dirs):
    home, cwd = dirs
    p = write(home / DEFAULT_NAME, "A=1")
    assert load(home, cwd) == ({"A": "1"}, [p])


def test_cwd_only(dirs):
    home, cwd = dirs
    p = write(cwd / DEFAULT_NAME, "A=1")
    assert load(home, cwd) == ({"A": "1"}, [p])


def test_cwd_overrides_home_key_by_key(dirs):
    home, cwd = dirs
    ph = write(home / DEFAULT_NAME, "A=home\nB=home")
    pc = write(cwd / DEFAULT_NAME, "B=cwd\nC=cwd")
    env, paths = load(home, cwd)
    assert env == {"A": "home", "B": "cwd", "C": "cwd"}
    assert paths == [ph, pc]


def test_same_dir_read_once(dirs):
    home, _ = dirs
    p = write(home / DEFAULT_NAME, "A=1")
    assert load(home, home) == ({"A": "1"}, [p])


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_same_file_via_symlink_read_once(dirs):
    home, cwd = dirs
    p = write(home / DEFAULT_NAME, "A=1")
    os.symlink(p, cwd / DEFAULT_NAME)
    env, paths = load(home, cwd)
    assert env == {"A": "1"}
    assert paths == [p]


def test_ds_env_file_relative_name(dirs):
    home, cwd = dirs
    write(home / DEFAULT_NAME, "IGNORED=1")
    ph = write(home / "custom.env", "A=home")
    pc = write(cwd / "custom.env", "A=cwd\nB=2")
    env, paths = load(home, cwd, environ={"DS_ENV_FILE": "custom.env"})
    assert env == {"A": "cwd", "B": "2"}
    assert paths == [ph, pc]


def test_ds_env_file_empty_means_default(dirs):
    home, cwd = dirs
    p = write(cwd / DEFAULT_NAME, "A=1")
    assert load(home, cwd, environ={"DS_ENV_FILE": ""}) == ({"A": "1"}, [p])


def test_ds_env_file_absolute(dirs, tmp_path):
    home, cwd = dirs
    write(home / DEFAULT_NAME, "IGNORED=1")
    write(cwd / DEFAULT_NAME, "IGNORED=1")
    p = write(tmp_path / "elsewhere" / "my.env", "A=abs")
    assert load(home, cwd, environ={"DS_ENV_FILE": p}) == ({"A": "abs"}, [p])


def test_ds_env_file_absolute_missing(dirs, tmp_path):
    home, cwd = dirs
    missing = str(tmp_path / "nope.env")
    with pytest.raises(UserError) as info:
        load(home, cwd, environ={"DS_ENV_FILE": missing})
    assert info.value.where == "DS_ENV_FILE"
    assert missing in info.value.message
    assert info.value.hint


def test_ds_env_file_tilde_uses_given_home(dirs):
    home, cwd = dirs
    p = write(home / "sub" / "x.env", "A=1")
    env, paths = load(home, cwd, environ={"DS_ENV_FILE": "~/sub/x.env"})
    assert env == {"A": "1"}
    assert paths == [p]


def test_name_argument_beats_ds_env_file(dirs):
    home, cwd = dirs
    write(cwd / "from_env.env", "A=env")
    p = write(cwd / "from_name.env", "A=name")
    env, paths = load(home, cwd, name="from_name.env", environ={"DS_ENV_FILE": "from_env.env"})
    assert env == {"A": "name"}
    assert paths == [p]


def test_environ_defaults_to_os_environ(dirs, monkeypatch):
    home, cwd = dirs
    p = write(cwd / "via_os.env", "A=1")
    monkeypatch.setenv("DS_ENV_FILE", "via_os.env")
    assert load_env_files(home=str(home), cwd=str(cwd)) == ({"A": "1"}, [p])


def test_explicit_replaces_lookup(dirs, tmp_path):
    home, cwd = dirs
    write(home / DEFAULT_NAME, "A=home")
    write(cwd / DEFAULT_NAME, "A=cwd")
    p = write(tmp_path / "explicit.env", "A=explicit")
    env, paths = load(home, cwd, explicit=p, environ={"DS_ENV_FILE": "whatever"})
    assert env == {"A": "explicit"}
    assert paths == [p]


def test_explicit_relative_to_cwd(dirs):
    home, cwd = dirs
    p = write(cwd / "conf" / "e.env", "A=1")
    env, paths = load(home, cwd, explicit="conf/e.env")
    assert env == {"A": "1"}
    assert os.path.samefile(paths[0], p)


def test_explicit_missing_is_error(dirs, tmp_path):
    home, cwd = dirs
    write(cwd / DEFAULT_NAME, "A=1")
    missing = str(tmp_path / "missing.env")
    with pytest.raises(UserError) as info:
        load(home, cwd, explicit=missing)
    assert info.value.where == "--env-file"
    assert missing in info.value.message
    assert info.value.hint


def test_explicit_directory_is_error(dirs, tmp_path):
    home, cwd = dirs
    with pytest.raises(UserError) as info:
        load(home, cwd, explicit=str(tmp_path))
    assert info.value.where == "--env-file"


def test_lookup_path_that_is_a_directory_is_error(dirs):
    home, cwd = dirs
    (cwd / DEFAULT_NAME).mkdir()
    with pytest.raises(UserError) as info:
        load(home, cwd)
    assert DEFAULT_NAME in info.value.where


def test_parse_error_names_real_path_and_line(dirs):
    home, cwd = dirs
    write(home / DEFAULT_NAME, "A=1")
    p = write(cwd / DEFAULT_NAME, "A=1\nB='open")
    with pytest.raises(UserError) as info:
        load(home, cwd)
    assert info.value.where == f"{p}:2"


def test_crlf_bom_file(dirs):
    home, cwd = dirs
    p = cwd / DEFAULT_NAME
    p.write_bytes(b"\xef\xbb\xbfA=1\r\nB='x y'\r\n")
    assert load(home, cwd)[0] == {"A": "1", "B": "x y"}


def test_non_utf8_file(dirs):
    home, cwd = dirs
    p = cwd / DEFAULT_NAME
    p.write_bytes(b"A=1\nB=caf\xe9\n")
    with pytest.raises(UserError) as info:
        load(home, cwd)
    assert info.value.where == f"{p}:2"


def test_byte_exact_values_from_file(dirs):
    home, cwd = dirs
    text = 'CMD=\'$(rm -rf /); `id` && echo "x"\'\nJSON=\'{"a": [1, 2], "u": "ü"}\'\nEQ=a=b=c\nSEMI=a;b\nUNI=日本 ✓\n'
    write(cwd / DEFAULT_NAME, text)
    assert load(home, cwd)[0] == {
        "CMD": '$(rm -rf /); `id` && echo "x"',
        "JSON": '{"a": [1, 2], "u": "ü"}',
        "EQ": "a=b=c",
        "SEMI": "a;b",
        "UNI": "日本 ✓",
    }


def test_unreadable_file_simulated(dirs, monkeypatch):
    import gaudi_launch.inputs.envfile as envfile

    home, cwd = dirs
    p = write(cwd / DEFAULT_NAME, "A=1")

    def deny(*args, **kwargs):
        raise PermissionError(13, "Permission denied", p)

    monkeypatch.setattr(envfile, "read_regular", deny)
    with pytest.raises(UserError) as info:
        load(home, cwd)
    assert info.value.where == p
    assert "permission" in info.value.message
    assert info.value.hint


# ---------------------------------------------------------------- parse_assignments


def test_assignments_basic():
    assert parse_assignments(["A=1", "B=", "C=x=y", "A=2"]) == {"A": "2", "B": "", "C": "x=y"}


def test_assignments_byte_exact():
    items = ["Q='quoted'", 'D="dq"', "S= spaced ", "C=$(id);`x`", 'J={"a": 1}', "U=ü✓"]
    assert parse_assignments(items) == {
        "Q": "'quoted'",
        "D": '"dq"',
        "S": " spaced ",
        "C": "$(id);`x`",
        "J": '{"a": 1}',
        "U": "ü✓",
    }


def test_assignments_empty():
    assert parse_assignments([]) == {}


def test_assignments_missing_equals():
    with pytest.raises(UserError) as info:
        parse_assignments(["A=1", "HF_HOME"])
    assert info.value.where == "-x"
    assert "HF_HOME" in info.value.message
    assert info.value.hint


def test_assignments_bare_name_passes_the_launchers_value():
    # `-x NAME` instead of `-x NAME="$NAME"`: the value never stands on gaudi-launch's own argv.
    assert parse_assignments(["HF_TOKEN", "A=1"], environ={"HF_TOKEN": "hf_x y"}) == {"HF_TOKEN": "hf_x y", "A": "1"}
    with pytest.raises(UserError) as info:
        parse_assignments(["HF_TOKEN"], environ={})
    assert "HF_TOKEN is not set" in info.value.message and "export HF_TOKEN" in info.value.hint


def test_assignments_hint_never_suggests_a_value_on_the_command_line():
    with pytest.raises(UserError) as info:
        parse_assignments(["HF_HOME"])
    assert "$" not in info.value.hint


@pytest.mark.parametrize("item", ["1A=x", "A-B=x", " A=x", "=x", "A B=x"])
def test_assignments_bad_name(item):
    with pytest.raises(UserError) as info:
        parse_assignments([item], option="--env")
    assert info.value.where == "--env"
    assert repr(item.partition("=")[0]) in info.value.message


def test_assignments_bad_name_does_not_echo_value():
    with pytest.raises(UserError) as info:
        parse_assignments(["HF-TOKEN=hf_supersecret"])
    assert "hf_supersecret" not in str(info.value)


# ---------------------------------------------------------------- secrets


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "WANDB_API_KEY",
        "GITHUB_TOKEN",
        "DB_PASSWORD",
        "HUGGINGFACEHUB_API_TOKEN",
        "hf_token",
        "MY_PASSWD",
        "SMTP_PASS",
        "OPENAI_APIKEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "AZURE_CREDENTIAL",
        "SSH_PRIVATE_KEY",
        "KEY",
        "ACCESSTOKEN",
        "MYSECRETTHING",
        "ROOTPASSWORD",
    ],
)
def test_is_secret_yes(name):
    assert is_secret(name)


@pytest.mark.parametrize(
    "name",
    [
        "PATH",
        "KEYBOARD_LAYOUT",
        "MONKEY",
        "HCCL_OVER_OFI",
        "LD_LIBRARY_PATH",
        "PASSPORT",
        "MASTER_ADDR",
        "HOME",
        "PT_HPU_LAZY_MODE",
        "KEYS",
        "",
    ],
)
def test_is_secret_no(name):
    assert not is_secret(name)


def test_mask_env():
    env = {"HF_TOKEN": "hf_abc", "PATH": "/bin", "DB_PASSWORD": "", "API_KEY": "x"}
    masked = mask_env(env)
    assert masked == {"HF_TOKEN": "***", "PATH": "/bin", "DB_PASSWORD": "", "API_KEY": "***"}
    assert env["HF_TOKEN"] == "hf_abc"  # a copy


def test_mask_text():
    env = {"HF_TOKEN": "hf_abcdef", "PATH": "/usr/bin", "DB_PASS": "abc", "EMPTY_TOKEN": ""}
    text = "ssh n1 env HF_TOKEN=hf_abcdef PATH=/usr/bin DB_PASS=abc x; echo hf_abcdef"
    assert mask_text(text, env) == "ssh n1 env HF_TOKEN=*** PATH=/usr/bin DB_PASS=*** x; echo ***"


def test_mask_text_overlapping_secrets_longest_first():
    env = {"A_TOKEN": "abcd", "B_TOKEN": "abcdefgh"}
    assert mask_text("x abcdefgh y abcd", env) == "x *** y ***"


def test_mask_text_regex_metacharacters():
    env = {"P_PASSWORD": "a.b*c(d)$"}
    assert mask_text("pw=a.b*c(d)$ and aXbbc", env) == "pw=*** and aXbbc"


def test_mask_text_shell_quoted_form():
    import shlex

    secret = "it's-secret"
    line = f"export DB_PASSWORD={shlex.quote(secret)}"
    assert secret not in mask_text(line, {"DB_PASSWORD": secret})
    assert "s-secret" not in mask_text(line, {"DB_PASSWORD": secret})


def test_mask_text_multi_line_secret_line_by_line():
    key = "-----BEGIN KEY-----\nMIIEv9Qabc\nxy\n-----END KEY-----\n"
    env = {"SSH_PRIVATE_KEY": key}
    for line in key.splitlines():
        assert mask_text(f"[rank 0] {line}", env) == "[rank 0] ***"
    assert mask_text(key, env) == "***"
    assert mask_text("xyz oxy", env) == "xyz oxy"  # a short line only as a whole word


def test_mask_text_short_secrets_as_whole_words():
    env = {"PIN_PASSWORD": "42", "X_TOKEN": "ab", "ONE_KEY": "1"}
    assert mask_text("pin 42, code 420, ab abc, rank 1", env) == "pin ***, code 420, *** abc, rank 1"


def test_mask_text_no_secrets():
    assert mask_text("hello", {}) == "hello"
    assert mask_text("", {"HF_TOKEN": "abcdef"}) == ""


# ---------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(list("=#'\"\\ \t\r\nAx_"))))
def test_property_arbitrary_text_never_crashes(text):
    try:
        result = parse_env_text(text, "src")
    except UserError as err:
        assert err.where is not None
        prefix, _, n = err.where.rpartition(":")
        assert prefix == "src"
        assert 1 <= int(n) <= text.count("\n") + 1
    else:
        assert isinstance(result, dict)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in result.items())


_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)
_VALUES = st.text(st.characters(codec="utf-8", exclude_characters="\n\0"), max_size=40)


def _double_quote(value: str, escape_more: bool) -> str:
    out = value.replace("\\", "\\\\").replace('"', '\\"')
    if escape_more:
        out = out.replace("$", "\\$").replace("\t", "\\t")
    return f'"{out}"'


@settings(max_examples=300, deadline=None)
@given(
    name=_NAMES,
    value=_VALUES,
    style=st.sampled_from(["single", "double", "double-escaped"]),
    export=st.booleans(),
    lead=st.sampled_from(["", " ", "\t "]),
    trail=st.sampled_from(["", " ", " # note", "\t#x", "\r"]),
)
def test_property_round_trip(name, value, style, export, lead, trail):
    if style == "single":
        if "'" in value:
            style = "double"
        else:
            quoted = f"'{value}'"
    if style != "single":
        quoted = _double_quote(value, style == "double-escaped")
    prefix = "export " if export else ""
    text = f"# header\n{lead}{prefix}{name}={quoted}{trail}\nOTHER_=1\n"
    expected = {name: value}
    expected["OTHER_"] = "1"  # the later line wins if the names collide
    assert parse_env_text(text, "rt") == expected


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_NAMES, _VALUES, max_size=5))
def test_property_assignments_round_trip(env):
    assert parse_assignments([f"{k}={v}" for k, v in env.items()]) == env


# ---- issue 27 item 5: wider names, URLs with a password, escaped forms ----------------------------


@pytest.mark.parametrize(
    "name", ["GITHUB_PAT", "GH_PAT", "AZURE_DEVOPS_EXT_PAT", "githubPat", "wandbKey", "DB_CREDENTIAL"]
)
def test_personal_access_tokens_and_camel_case_names_are_secret(name):
    assert is_secret(name)


@pytest.mark.parametrize(
    "value",
    [
        "postgres://app:s3cr3t-pw@db.internal:5432/prod",
        "redis://:onlypass@cache:6379/0",
        "https://user:p%40ss@example.org/x",
        "amqp://a:b@h1,amqp://c:d@h2",
    ],
)
def test_a_url_with_a_password_is_secret_whatever_its_name(value):
    assert is_secret("DATABASE_URL", value)
    assert mask_env({"DATABASE_URL": value}) == {"DATABASE_URL": "***"}


@pytest.mark.parametrize("value", ["postgres://app@db/prod", "https://example.org/a:b@c", "/srv/data", "http://h:80/"])
def test_a_url_without_a_password_is_not_secret(value):
    assert not is_secret("DATABASE_URL", value)
    assert mask_env({"DATABASE_URL": value}) == {"DATABASE_URL": value}


def test_a_urls_password_alone_is_masked_too_and_its_decoded_form():
    env = {"DATABASE_URL": "postgres://app:pa%24%24word9@db/prod"}
    text = "connect postgres://app:pa%24%24word9@db/prod failed; retry with pa$$word9 or pa%24%24word9"
    assert mask_text(text, env) == "connect *** failed; retry with *** or ***"


@pytest.mark.parametrize("secret", ['hf_ab"cd\\ef', "it's\\x", 'line\none"two', "caf\u00e9-t\u00f6ken-9"])
def test_escaped_forms_of_a_secret_are_masked(secret):
    import json

    env = {"HF_TOKEN": secret}
    shown = [repr(secret), json.dumps(secret), json.dumps(secret, ensure_ascii=False), repr({"k": secret})]
    for text in shown:
        body = text[7:-2] if text.startswith("{") else text[1:-1]  # what stands between the quotes
        masked = mask_text(f"env: {text}", env)
        # the shell-quoted form may take the quotes with it
        assert unquote(masked) == unquote(f"env: {text}".replace(body, "***")), masked


def unquote(text: str) -> str:
    return text.replace("'***'", "***").replace('"***"', "***")


def test_switch_values_and_tokenizer_settings_are_not_masked_in_output():
    # the launcher's whole environment is masked in output now: a PRIVATE_MODE=true must not hide
    # every "true" a rank prints, and TOKENIZERS_PARALLELISM holds no token
    assert not is_secret("TOKENIZERS_PARALLELISM") and is_secret("TOKENIZER_API_TOKEN")
    env = {"PRIVATE_MODE": "true", "USE_KEY": "Off", "HF_TOKEN": "hf_tok123456"}
    assert mask_text("flag true, Off, hf_tok123456", env) == "flag true, Off, ***"


# ---------------------------------------------------------------- issue 36 item 1: found files, owner and loaders


def test_owner_problem_follows_sshs_strict_modes():
    from gaudi_launch.inputs.envfile import owner_problem

    def st(uid, mode):
        return os.stat_result((0o100000 | mode, 0, 0, 1, uid, uid, 0, 0, 0, 0))

    assert owner_problem(st(1000, 0o644), 1000) is None
    assert owner_problem(st(0, 0o600), 1000) is None  # root's
    assert owner_problem(st(1001, 0o600), 1000).startswith("belongs to ")
    assert owner_problem(st(1000, 0o664), 1000) == "is writable by its group (mode 664)"
    assert owner_problem(st(0, 0o646), 1000) == "is writable by others (mode 646)"


@pytest.mark.parametrize("name", ["LD_PRELOAD", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "LD_LIBRARY_PATH"])
def test_a_found_file_may_not_set_a_loader_variable(dirs, name):
    home, cwd = dirs
    p = write(cwd / DEFAULT_NAME, f"A=1\n\n{name}=/x\n")
    with pytest.raises(UserError) as info:
        load(home, cwd)
    assert info.value.where == f"{p}:3" and name in info.value.message
    assert load(home, cwd, explicit=p)[0] == {"A": "1", name: "/x"}  # named with --env-file: as asked


# ---------------------------------------------------------------- issue 36 item 8: masking gaps


@pytest.mark.parametrize(
    "name",
    [
        "DB_PASSPHRASE",
        "MYSQL_PWD",
        "NPM_AUTH",
        "MY_JWT",
        "SENTRY_DSN",
        "SLACK_WEBHOOK_URL",
        "SESSION_SECRET",
        "AUTH_COOKIE",
        "FLASK_SESSION",
        "SESSION_ID",
        "AZURE_STORAGE_CONNECTION_STRING",
        "HCCL_SOCKET_TOKEN",
        "PT_HPU_DB_PASSWORD",
    ],
)
def test_more_secret_names(name):
    assert is_secret(name, "value")


@pytest.mark.parametrize(
    "name",
    [
        "PWD",
        "OLDPWD",
        "XDG_SESSION_CLASS",
        "DESKTOP_SESSION",
        "SSH_AUTH_SOCK",
        "GIT_AUTHOR_NAME",
        "AUTHOR",
        "TEST_SESSION_DEADLINE_S",  # CI's own setting: masking it put a digest in every golden plan there
    ],
)
def test_the_working_directory_and_the_desktops_session_are_not_secrets(name):
    assert not is_secret(name, "user")


@pytest.mark.parametrize(
    "value, hidden",
    [
        ("Bearer abcdefgh12345678", "abcdefgh12345678"),
        (
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJl",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJl",
        ),
        (
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=Zm9vYmFyYmF6cXV4==;EndpointSuffix=core",
            "Zm9vYmFyYmF6cXV4==",
        ),
        ("Server=db;User Id=sa;Password=S3cretPw;", "S3cretPw"),
        ("https://user:hunter22@example.com/x", "hunter22"),
    ],
)
def test_secret_values_whatever_the_name(value, hidden):
    assert is_secret("HEADER", value)
    assert mask_text(f"said {hidden} here", {"HEADER": value}) == "said *** here"


def test_escaped_non_ascii_forms_of_a_secret_are_masked():
    import json as _json
    from urllib.parse import quote as _quote

    env = {"DB_PASSWORD": "pässwörd9"}
    for form in (
        ascii("pässwörd9")[1:-1],
        repr("pässwörd9".encode())[2:-1],
        _quote("pässwörd9"),
        _json.dumps("pässwörd9")[1:-1],
        "pässwörd9".encode("unicode_escape").decode(),
    ):
        assert mask_text(f"<{form}>", env) == "<***>", form


def test_straddling_keeps_the_start_of_a_secret_cut_by_a_split():
    env = {"HF_TOKEN": "hf_abcdefghijklmnop"}
    assert straddling(b"x" * 100 + b"hf_abcd", env) == 7
    assert straddling(b"x" * 100 + b"hf_abcdefghijklmnop", env) == 0  # whole: masked in this piece
    assert straddling(b"x" * 100, env) == 0
    assert straddling(b"x" * 100 + b"h", {"A": "1"}) == 0  # no secret


def test_an_unset_secret_is_not_suggested_on_the_command_line():
    with pytest.raises(UserError) as info:
        parse_assignments(["HF_TOKEN"], "-x", environ={})
    assert "export HF_TOKEN in this shell first" in info.value.hint and "--env-file" in info.value.hint
    assert "-x HF_TOKEN=" not in info.value.hint
