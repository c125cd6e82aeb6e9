"""A credential handed to a program as a file its argv names: ``--password-file={credential_file:db}``.

Programs that take a password or key file as an option (``--password-file``, ``--key-file``,
``-f FILE``) get the path of a sealed in-memory file holding the credential, ``/dev/fd/N``;
the value is in no argv, no folder and no result, and a caller's input that spells the marker
is never filled.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rungd.core.errors import ConfigError
from rungd.testing import STUB_DESCRIPTION, serve_tool_file
from rungd_plugins.declarative import read_tool_file

SECRET = "db-Pass-4471"

READER = """
    import sys
    path = sys.argv[sys.argv.index("--password-file") + 1]
    print("path", path)
    print("secret", open(path).read())
    print("argv", " ".join(sys.argv[1:]))
    """


def tool_file(program: Path, argv: str, inputs: str = "") -> str:
    return (f'[program]\nname = "reader"\ncommand = "{program}"\n\n[tools.db_secret_show]\nargv = {argv}\n'
            f'[tools.db_secret_show.description]\n{STUB_DESCRIPTION}[tools.db_secret_show.parse]\nkind = "lines"\n'
            + inputs)


async def serve(nursery, short_tmp: Path, text: str):
    creds = short_tmp / "creds.toml"
    creds.write_text(f'db = "{SECRET}"\n')
    creds.chmod(0o600)
    return await serve_tool_file(nursery, short_tmp, text, config=f'[credentials]\nfile = "{creds}"\n')


async def test_argv_names_a_sealed_file_holding_the_credential_and_nothing_shows_it(
        nursery, short_tmp, fake_program) -> None:
    program = fake_program("reader", READER)
    daemon = await serve(nursery, short_tmp, tool_file(program, '["--password-file", "{credential_file:db}"]'))
    env = await daemon.call("db_secret_show", {})
    assert env.status == "ok", env.error
    lines = env.fields["lines"]
    path = next(line.split(" ", 1)[1] for line in lines if line.startswith("path "))
    assert path.startswith("/dev/fd/")  # in no folder
    assert "secret [REDACTED]" in lines  # it read the value; what it printed of it is redacted
    for folder in (daemon.config.state_dir / "ledger", daemon.config.state_dir / "evidence"):
        for file in folder.rglob("*"):
            assert not file.is_file() or SECRET.encode() not in file.read_bytes(), file
    daemon.daemon.stop()


async def test_a_callers_input_that_spells_the_marker_is_never_filled(nursery, short_tmp, fake_program) -> None:
    program = fake_program("reader", READER)
    inputs = ('[tools.db_secret_show.inputs.note]\ndescription = "A note."\nexample = "x"\n'
              'pattern = "^[a-z_:{}]+$"\n')
    daemon = await serve(nursery, short_tmp, tool_file(
        program, '["--password-file", "{credential_file:db}", "{note}"]', inputs))
    env = await daemon.call("db_secret_show", {"note": "{credential_file:db}"})
    assert env.status == "ok", env.error
    argv = next(line for line in env.fields["lines"] if line.startswith("argv "))
    assert argv.endswith(" {credential_file:db}")  # the caller's text, as sent: no second file
    assert argv.count("/dev/fd/") == 1
    daemon.daemon.stop()


async def test_a_credential_the_store_lacks_starts_nothing(nursery, short_tmp, fake_program) -> None:
    program = fake_program("reader", READER)
    daemon = await serve(nursery, short_tmp, tool_file(program, '["--password-file", "{credential_file:other}"]'))
    env = await daemon.call("db_secret_show", {})
    assert (env.error.code, env.outcome) == ("AUTH_REQUIRED", "not_started"), env.error
    daemon.daemon.stop()


@pytest.mark.parametrize(("argv", "inputs", "words"), [
    ('["--password-file={credential_file:db}{note}"]', '[tools.db_secret_show.inputs.note]\n'
     'description = "n."\nexample = "x"\npattern = "^[a-z]+$"\n', "holds nothing else to fill in"),
    ('["{credential_file:}"]', "", "write {credential_file:NAME}"),
    ('["x"]', '[tools.db_secret_show.inputs.credential_file]\ndescription = "n."\nexample = "x"\n'
     'pattern = "^[a-z]+$"\n', "the name is taken"),
])
def test_a_credential_file_word_that_could_be_misread_is_refused_at_load(tmp_path, argv, inputs, words) -> None:
    path = tmp_path / "x.toml"
    path.write_text(tool_file(Path("/bin/echo"), argv, inputs))
    with pytest.raises(ConfigError, match=words.replace("{", r"\{").replace("}", r"\}")):
        read_tool_file(path)
