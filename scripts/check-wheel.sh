#!/usr/bin/env bash
# Build the sdist and the wheel as a user's pip would, install the wheel (with its [train] extra) in a clean
# venv, and run it from outside the source tree: --version, --help, a dry run, and the demo's first steps
# (the shipped model config, corpus and tokenizer must come from the wheel's package data).
# CI runs it before the tests; WHEEL_CHECK_DIR keeps the venv between runs (default: a fresh temp dir).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "check-wheel: $*" >&2; }
repo=$PWD
work=${WHEEL_CHECK_DIR:-$(mktemp -d)}
mkdir -p "$work"
rm -rf "$work/dist" "$work/run"
say "building the sdist and the wheel into $work/dist"
.venv/bin/python -m pip wheel -q --disable-pip-version-check --no-deps -w "$work/dist" . 2>&1 | grep -v "is ignored" >&2 || true
.venv/bin/python -c "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])" "$work/dist" >/dev/null
wheel=$(ls "$work"/dist/gaudi_launch-*.whl)
sdist=$(ls "$work"/dist/gaudi_launch-*.tar.gz)
for member in LICENSE gaudi_launch/runtime/assets/tokenizer/tokenizer.json gaudi_launch/remote/scripts/probe.sh; do
  .venv/bin/python - "$wheel" "$sdist" "$member" <<'PY'
import sys, tarfile, zipfile
wheel, sdist, member = sys.argv[1:]
names = zipfile.ZipFile(wheel).namelist()
in_wheel = any(n == member or n.endswith(".dist-info/licenses/" + member) or n.endswith(".dist-info/" + member) for n in names)
in_sdist = any(n.endswith("/" + member) for n in tarfile.open(sdist).getnames())
if not (in_wheel and in_sdist):
    sys.exit(f"check-wheel: {member} is missing from the {'wheel' if not in_wheel else 'sdist'}")
PY
done
if [ ! -x "$work/venv/bin/python" ]; then
  say "creating a clean venv in $work/venv"
  python3 -m venv "$work/venv"
fi
say "installing $(basename "$wheel")[train] into it (torch pinned as in the development set-up)"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check -c scripts/constraints.txt \
  --force-reinstall --no-deps "$wheel" 2>&1 | grep -v "is ignored" >&2 || true
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check -c scripts/constraints.txt \
  "${wheel}[train]" 2>&1 | grep -v "is ignored" >&2 || true
mkdir -p "$work/run"
cp scripts/run_clm.py "$work/run/"
cd "$work/run"  # nothing of the source tree on sys.path from here on
gl="$work/venv/bin/gaudi-launch"
"$work/venv/bin/python" -c "import gaudi_launch, sys; sys.exit(gaudi_launch.__file__.startswith('$repo'))" \
  || { say "the clean venv imports gaudi_launch from the source tree"; exit 1; }
version=$("$gl" --version)
[ "$version" = "gaudi-launch $("$work/venv/bin/python" -c 'import gaudi_launch; print(gaudi_launch.__version__)')" ] \
  || { say "--version says '$version'"; exit 1; }
"$gl" --help >/dev/null
"$gl" --num_devices 2 --device cpu --dry-run run_clm.py --do_train >/dev/null
say "$version: --help and a dry run work; the demo's first steps from the wheel..."
"$gl" --num_devices 2 --device cpu --log-dir logs run_clm.py --model_name_or_path gpt2-xl \
  --gaudi_config_name Habana/gpt2 --do_train --output_dir out --overwrite_output_dir --max_steps 2 \
  --per_device_train_batch_size 2 --use_habana --use_lazy_mode --logging_steps 1 >run.log 2>&1 \
  || { tail -30 run.log >&2; say "the demo's first steps failed from the wheel"; exit 1; }
grep -q "job done" run.log || { tail -30 run.log >&2; say "no 'job done' summary"; exit 1; }
say "ok: the wheel and sdist build, install in a clean venv, and run the demo's first steps"
