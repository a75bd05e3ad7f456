#!/usr/bin/env bash
# Portable wheels: build the sdist, build the manylinux2014 (glibc 2.17) abi3 wheels from it,
# then check them (tests/test_wheel.py: tags, ELF machine, linked libraries,
# glibc symbol versions, auditwheel's verdict, and install-and-run on CPython 3.10 and 3.13).
#
#   bash scripts/wheels.sh [--arch "x86_64 aarch64"] [--out DIR] [--rebuild]
#
# --arch     the architectures to build (default: both); x86_64 is always built, since the
#            install tests run it. With the default, an aarch64 standard library that rustup
#            cannot install is a loud warning and an x86_64-only run; named explicitly, an error.
# --out      where the artefacts end up (default: target/portable-wheels; not dist/, which
#            the other scripts empty before every build)
# --rebuild  ignore the cache below
#
# How the wheels are built is maturin's documented cross-compiling route, run in the unpacked
# sdist:
#   maturin build --release --strip --zig --compatibility manylinux2014 --target <arch>-unknown-linux-gnu
# zig (the `ziglang` package from PyPI, pinned below) links against glibc 2.17's symbol
# versions whatever the build machine's glibc is, so no manylinux container is needed. The
# rust standard library for each target comes from rustup (`rustup target add`).
#
# Cache: a release build is minutes of CPU, so the checked artefacts are kept in
# $CARGO_TARGET_DIR/awa-wheels/<key>/, where <key> hashes every input of the build (the sources
# that go into the sdist, the flags, and the versions of rustc, maturin and zig). A run whose
# key has been built before copies that result and only re-runs the checks; the two newest keys
# are kept. The cargo target dir itself is shared with the other scripts, so a rebuild after a
# source change recompiles only the awa crates.
source "$(dirname "$0")/lib.sh"

ZIGLANG_VERSION="0.17.1"
AUDITWHEEL_VERSION="6.8.2"
# maturin's flags for every wheel (with --target <arch>-unknown-linux-gnu); part of the cache key.
BUILD_FLAGS="--release --strip --zig --compatibility manylinux2014"
# Bump when build_all changes how artefacts are made, to retire cached ones.
BUILD_RECIPE=1

ARCHES="x86_64 aarch64"
ARCHES_EXPLICIT=0
OUT="$ROOT/target/portable-wheels"
REBUILD=0
while [ $# -gt 0 ]; do
    case "$1" in
        --arch) ARCHES="$2"; ARCHES_EXPLICIT=1; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --rebuild) REBUILD=1; shift ;;
        -h|--help) sed -n '2,/^source/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "wheels.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case " $ARCHES " in *" x86_64 "*) ;; *) ARCHES="x86_64 $ARCHES" ;; esac
for arch in $ARCHES; do
    case "$arch" in x86_64|aarch64) ;; *) echo "wheels.sh: unsupported arch $arch" >&2; exit 2 ;; esac
done

ensure_venv
# maturin finds zig as `python3 -m ziglang` with the venv's python first on PATH.
export PATH="$VENV/bin:$PATH"
if ! "$PY" -m ziglang version 2>/dev/null | grep -qx "$ZIGLANG_VERSION" \
    || ! "$VENV/bin/auditwheel" --version 2>/dev/null | grep -q "^auditwheel $AUDITWHEEL_VERSION "; then
    log "installing ziglang $ZIGLANG_VERSION and auditwheel $AUDITWHEEL_VERSION"
    "$PY" -m pip install --quiet "ziglang==$ZIGLANG_VERSION" "auditwheel==$AUDITWHEEL_VERSION"
fi

available=""
for arch in $ARCHES; do
    target="$arch-unknown-linux-gnu"
    if ! rustup target list --installed | grep -qx "$target"; then
        log "installing the rust standard library for $target (rustup target add)"
        if ! rustup target add "$target"; then
            if [ "$ARCHES_EXPLICIT" = 1 ] || [ "$arch" = x86_64 ]; then
                log "FAILED: rustup could not install $target (build without it: --arch x86_64)"
                exit 1
            fi
            log "WARNING: rustup could not install $target: NO $arch WHEEL is built or checked in this run"
            continue
        fi
    fi
    available="$available $arch"
done
ARCHES="${available# }"

# Every input of the build, by content: the files the sdist is made of, the flags, the tools.
source_key() {
    (
        cd "$ROOT"
        git ls-files -co --exclude-standard -- Cargo.toml Cargo.lock pyproject.toml README.md \
            LICENSE-MIT LICENSE-APACHE awa-core awa-python python \
            | LC_ALL=C sort | while IFS= read -r f; do [ -f "$f" ] && sha256sum "$f"; done
        rustc -V
        "$VENV/bin/maturin" --version
        "$PY" -m ziglang version
        echo "arches: $ARCHES; flags: $BUILD_FLAGS; recipe: $BUILD_RECIPE"
    ) | sha256sum | cut -c1-16
}

CACHE_ROOT="$CARGO_TARGET_DIR/awa-wheels"
KEY="$(source_key)"
CACHE="$CACHE_ROOT/$KEY"

timed() { # $1 = what, rest = command: runs it, then logs its wall-clock and CPU seconds
    local what="$1" TIMEFORMAT
    shift
    TIMEFORMAT="==>   $what: %0R s wall, %0U s user + %0S s sys CPU"
    time "$@"
}

build_all() { # $1 = staging dir
    local stage="$1" arch
    log "building the sdist (maturin sdist)"
    (cd "$ROOT" && "$VENV/bin/maturin" sdist --out "$stage" >&2)
    local sdist
    sdist="$(ls "$stage"/awa_queue-*.tar.gz)"
    # Every wheel is built from the sdist, unpacked, so the sdist is proven to build by the very
    # wheels that ship. The maturin is the project venv's (the one the other scripts build
    # with), not one in a fresh venv or pip's isolated build environment: zig's linker wrappers
    # live in a directory named after the path of the maturin binary, and a changed linker
    # invalidates all of cargo's cache, so a maturin at a new path recompiles ~130 crates
    # (measured: a full cold build) where this one recompiles only the two awa crates. For the
    # same reason the sdist is unpacked at a fixed path. The clean-venv part of the check is
    # the install side: each wheel goes into fresh virtualenvs (tests/test_wheel.py).
    local build="$CARGO_TARGET_DIR/awa-sdist-build"
    rm -rf "$build"
    mkdir -p "$build"
    # -m: the sdist stores a fixed 2006 timestamp (reproducible archives); files that old would
    # look unchanged to cargo and a changed source would not be recompiled.
    tar -xzmf "$sdist" -C "$build"
    local src
    src="$(ls -d "$build"/awa_queue-*)"
    for arch in $ARCHES; do
        log "building the $arch wheel from $(basename "$sdist") (release, zig, manylinux2014)"
        # shellcheck disable=SC2086 # BUILD_FLAGS is a list of words
        (cd "$src" && timed "$arch wheel" "$VENV/bin/maturin" build $BUILD_FLAGS \
            --target "$arch-unknown-linux-gnu" --out "$stage" >&2)
    done
}

if [ "$REBUILD" = 0 ] && [ -f "$CACHE/complete" ]; then
    log "reusing the wheels built from these exact sources ($CACHE)"
else
    rm -rf "$CACHE.tmp"
    mkdir -p "$CACHE.tmp"
    build_all "$CACHE.tmp"
    rm -rf "$CACHE"
    mv "$CACHE.tmp" "$CACHE"
    touch "$CACHE/complete"
    # Keep the two newest keys.
    ls -1dt "$CACHE_ROOT"/*/ 2>/dev/null | tail -n +3 | while IFS= read -r old; do rm -rf "$old"; done
fi

rm -rf "$OUT"
mkdir -p "$OUT"
cp -R "$CACHE/." "$OUT/"
rm -f "$OUT/complete"
log "artefacts in $OUT:"
(cd "$OUT" && find . -type f \( -name '*.whl' -o -name '*.tar.gz' \) -printf '  %P (%s bytes)\n' >&2)

ensure_database
# tests/conftest.py imports awa (for its database fixtures): a fresh checkout's venv has none yet.
if ! "$PY" -c 'import awa' 2>/dev/null; then
    "$PY" -m pip install --quiet --no-deps "$(ls "$OUT"/awa_queue-*x86_64.whl)"
fi
log "checking the wheels (tests/test_wheel.py)"
(cd "$ROOT" && AWA_WHEEL_DIR="$OUT" AWA_WHEEL_ARCHES="$ARCHES" "$PY" -m pytest -q -p no:cacheprovider tests/test_wheel.py)
log "wheels checked"
