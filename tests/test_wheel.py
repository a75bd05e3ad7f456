"""The portable wheels and the sdist that scripts/wheels.sh builds: what they claim, and that they
install and work on the Python versions they claim.

scripts/wheels.sh builds into a directory and runs this module with ``AWA_WHEEL_DIR`` pointing at
it; without that variable (a plain ``pytest`` run, scripts/test.sh) the module is skipped, since
there is no portable wheel to check. The directory holds:

- ``*.tar.gz``: the sdist;
- ``*.whl``: the manylinux2014 abi3 wheels, one per architecture, each built from that sdist by
  pip in a clean virtualenv (``AWA_WHEEL_ARCHES`` names the architectures the script built;
  x86_64 is always required) -- so the install tests below are also the proof that the sdist
  builds a working wheel.

The install tests need CPython 3.10 and 3.13 (the oldest and newest versions the wheel claims)
besides the running interpreter. They are looked up as ``AWA_PYTHON_3_10`` / ``AWA_PYTHON_3_13``
(a path), ``python3.10`` on PATH, or a pyenv installation (``$PYENV_ROOT/versions/3.10.*``); a
required version that cannot be found fails its test, saying where it looked.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

WHEEL_DIR = os.environ.get("AWA_WHEEL_DIR")
if not WHEEL_DIR:
    pytest.skip("no AWA_WHEEL_DIR: run `bash scripts/wheels.sh`, which builds the wheels and runs this module",
                allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
WHEELS = Path(WHEEL_DIR)
ARCHES = os.environ.get("AWA_WHEEL_ARCHES", "x86_64").split()
SMOKE = Path(__file__).resolve().parent / "wheel_smoke.py"
# manylinux2014 is glibc 2.17: no versioned symbol the module needs may be newer.
MAX_GLIBC = (2, 17)
# What manylinux2014 lets an extension link (PEP 599's list, less the X11/GL/C++ libraries this
# module has no use for). libpython is not on it: an abi3 module gets its symbols from the
# interpreter that loads it.
ALLOWED_LIBS = {
    "libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "libgcc_s.so.1",
    "libutil.so.1", "libresolv.so.2", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1",
}
ELF_MACHINE = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}
REQUIRED_PYTHONS = ("3.10", "3.13")
OPTIONAL_PYTHONS = ("3.11", "3.12")


def version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
    assert match
    return match.group(1)


def portable_wheel(arch: str) -> Path:
    found = sorted(WHEELS.glob(f"awa_queue-*-{arch}.whl")) + sorted(WHEELS.glob(f"awa_queue-*_{arch}.whl"))
    found = sorted(set(found))
    assert len(found) == 1, f"expected one {arch} wheel in {WHEELS}, found {[p.name for p in found]}"
    return found[0]


def python_version_of(exe: str) -> str | None:
    try:
        done = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def find_python(ver: str) -> tuple[str | None, list[str]]:
    """The first working CPython ``ver`` among the places the module docstring names."""
    candidates: list[str] = []
    override = os.environ.get("AWA_PYTHON_" + ver.replace(".", "_"))
    if override:
        candidates.append(override)
    on_path = shutil.which(f"python{ver}")
    if on_path:
        candidates.append(on_path)  # may be a pyenv shim that refuses: it is tried, not trusted
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(f"{pyenv_root}/versions/{ver}.*/bin/python{ver}"), reverse=True)
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == ver:
        candidates.append(sys.executable)
    for exe in candidates:
        if python_version_of(exe) == ver:
            return exe, candidates
    return None, candidates


def clean_env() -> dict[str, str]:
    """The environment without anything that would make a venv's Python see another's packages."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


def install_and_smoke(python: str, wheel: Path, tmp_path: Path, database_url: str) -> str:
    """A fresh virtualenv with nothing but ``wheel`` in it, installed by its own pip without an
    index (the wheel has no dependencies), then the smoke script against an empty database."""
    venv = tmp_path / "venv"
    run([python, "-m", "venv", str(venv)], tmp_path)
    vpy = str(venv / "bin" / "python")
    run([vpy, "-m", "pip", "install", "--no-index", "--no-deps", str(wheel)], tmp_path)
    done = run([vpy, str(SMOKE), database_url], tmp_path, timeout=180)
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("ok "), done.stdout
    # What ran is the installed wheel, not the checkout.
    assert f"package={venv}" in line and "_awa.abi3.so" in line, line
    return line


def glibc_versions_needed(so_bytes: bytes) -> set[tuple[int, ...]]:
    from io import BytesIO

    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    elf = ELFFile(BytesIO(so_bytes))
    needed: set[tuple[int, ...]] = set()
    for section in elf.iter_sections():
        if isinstance(section, GNUVerNeedSection):
            for _verneed, auxes in section.iter_versions():
                for aux in auxes:
                    name = aux.name
                    if name.startswith("GLIBC_") and name[6:7].isdigit():
                        needed.add(tuple(int(p) for p in name[6:].split(".")))
    return needed


def elf_facts(so_bytes: bytes) -> tuple[str, set[str]]:
    from io import BytesIO

    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    elf = ELFFile(BytesIO(so_bytes))
    libs: set[str] = set()
    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            libs |= {tag.needed for tag in section.iter_tags() if tag.entry.d_tag == "DT_NEEDED"}
    return elf["e_machine"], libs


@pytest.mark.parametrize("arch", ARCHES)
def test_the_wheel_is_abi3_manylinux2014_and_needs_nothing_newer(arch: str) -> None:
    wheel = portable_wheel(arch)
    # The file name carries the tags pip decides by: cp310-abi3 installs on every CPython >= 3.10.
    name, ver, python_tag, abi_tag, platforms = wheel.name[: -len(".whl")].split("-")
    assert (name, ver, python_tag, abi_tag) == ("awa_queue", version(), "cp310", "abi3"), wheel.name
    # Both spellings: PEP 600's for pip >= 20.3, PEP 599's alias for older pips.
    assert set(platforms.split(".")) == {f"manylinux_2_17_{arch}", f"manylinux2014_{arch}"}, wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = z.read(f"awa_queue-{version()}.dist-info/WHEEL").decode()
        so = z.read("awa/_awa.abi3.so")
    assert f"Tag: cp310-abi3-manylinux_2_17_{arch}" in info, info
    assert "Root-Is-Purelib: false" in info, info
    for part in ("awa/__init__.py", "awa/py.typed", "awa/_awa.pyi",
                 f"awa_queue-{version()}.dist-info/licenses/LICENSE-MIT",
                 f"awa_queue-{version()}.dist-info/licenses/LICENSE-APACHE"):
        assert part in names, f"{part} missing from {wheel.name}"
    assert not any(n.endswith(".so") and n != "awa/_awa.abi3.so" for n in names), names

    machine, libs = elf_facts(so)
    assert machine == ELF_MACHINE[arch]
    assert libs <= ALLOWED_LIBS, f"links libraries manylinux2014 does not provide: {libs - ALLOWED_LIBS}"
    needed = glibc_versions_needed(so)
    assert needed, "no versioned glibc symbols found: not a glibc build?"
    assert max(needed) <= MAX_GLIBC, f"needs glibc {'.'.join(map(str, max(needed)))}, more than 2.17"


@pytest.mark.parametrize("arch", ARCHES)
def test_auditwheel_agrees_the_wheel_is_manylinux_2_17(arch: str) -> None:
    wheel = portable_wheel(arch)
    done = run([sys.executable, "-m", "auditwheel", "show", str(wheel)], ROOT)
    text = " ".join(done.stdout.split())
    assert f'consistent with the following platform tag: "manylinux_2_17_{arch}"' in text, done.stdout


@pytest.mark.parametrize("ver", REQUIRED_PYTHONS + OPTIONAL_PYTHONS)
def test_the_x86_64_wheel_installs_and_runs(ver: str, tmp_path: Path, empty_database: str) -> None:
    python, looked = find_python(ver)
    if python is None:
        message = f"no CPython {ver} found (looked at {looked or 'nothing'}; set AWA_PYTHON_{ver.replace('.', '_')})"
        if ver in REQUIRED_PYTHONS:
            pytest.fail(message)
        pytest.skip(message)
    line = install_and_smoke(python, portable_wheel("x86_64"), tmp_path, empty_database)
    assert f"python={ver}." in line, line


def test_the_sdist_holds_what_a_build_needs() -> None:
    sdists = sorted(WHEELS.glob("awa_queue-*.tar.gz"))
    assert len(sdists) == 1, sdists
    with tarfile.open(sdists[0]) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for part in ("pyproject.toml", "Cargo.toml", "Cargo.lock", "PKG-INFO", "README.md",
                 "LICENSE-MIT", "LICENSE-APACHE", "awa-core/src/lib.rs", "awa-python/src/lib.rs",
                 "python/awa/__init__.py", "python/awa/_awa.pyi", "python/awa/py.typed"):
        assert part in names, f"{part} missing from {sdists[0].name}"
    assert not any(n.startswith((".venv/", "target/", "dist/", ".git/")) for n in names)
