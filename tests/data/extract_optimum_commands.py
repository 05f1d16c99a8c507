"""Writes optimum_habana_1.21.2_example_commands.tsv from a clone of huggingface/optimum-habana.

Not run by the tests (CI has no GitHub): run it by hand, `python tests/data/extract_optimum_commands.py CLONE COMMIT`.
Every shell block of examples/*/README.md is read, continuation lines joined; a command line that runs a
Python script (python3 run_*.py, gaudi_spawn.py ... run_*.py) whose source builds optimum-habana's training
arguments (Gaudi*TrainingArguments, or the TRL configs that extend them) is kept: its README, the script and
the script's own arguments (environment assignments and gaudi_spawn.py's arguments left out).
"""

from __future__ import annotations

import posixpath
import re
import shlex
import subprocess
import sys
from pathlib import Path

TRAINING = re.compile(r"Gaudi\w*TrainingArguments|Gaudi(SFT|GRPO|DPO|PPO|DDPO|Reward)Config")
OUT = Path(__file__).with_name("optimum_habana_1.21.2_example_commands.tsv")


def show(clone: str, commit: str, path: str) -> str:
    done = subprocess.run(["git", "-C", clone, "show", f"{commit}:{path}"], capture_output=True, text=True)
    return done.stdout


def commands(text: str) -> list[str]:
    """The command lines in a Markdown text's fenced blocks, continuations joined. Pure."""
    out, inside, pending = [], False, ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        joined = f"{pending} {stripped}" if pending else stripped
        if joined.endswith("\\"):
            pending = joined[:-1].rstrip()
            continue
        pending = ""
        if re.search(r"\S+\.py(\s|$)", joined) and re.search(r"\bpython3?\b", joined):
            out.append(joined)
    return out


def main(clone: str, commit: str) -> None:
    listing = subprocess.run(
        ["git", "-C", clone, "ls-tree", "-r", "--name-only", commit, "examples"], capture_output=True, text=True
    ).stdout.split()
    rows = []
    for readme in sorted(p for p in listing if re.fullmatch(r"examples/[^/]+/README\.md", p)):
        for line in commands(show(clone, commit, readme)):
            try:
                words = shlex.split(line)
            except ValueError:  # an unbalanced quote in a prompt text: not a training command
                continue
            at = [i for i, w in enumerate(words) if w.endswith(".py") and not w.endswith("gaudi_spawn.py")]
            if not at:
                continue
            script = words[at[0]]
            source = show(clone, commit, posixpath.normpath(posixpath.join(posixpath.dirname(readme), script)))
            if TRAINING.search(source):
                rows.append(f"{readme}\t{posixpath.basename(script)}\t{shlex.join(words[at[0] + 1 :])}")
    header = OUT.read_text().split("\n# ---\n")[0] if OUT.exists() else "# (header)"
    OUT.write_text(header.rstrip("\n") + "\n# ---\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
