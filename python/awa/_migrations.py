"""awa-pg's module-level schema functions: ``awa.migrate(url)``, ``migrations()``,
``migrations_range()`` and ``current_migration_version()``."""

from __future__ import annotations

from . import _awa

__all__ = ["current_migration_version", "migrate", "migrations", "migrations_range", "schema_patches"]


async def migrate(database_url: str) -> None:
    """Create or upgrade the ``awa`` schema of the database at ``database_url`` (what
    ``AsyncClient(database_url).migrate()`` does, on a short-lived pool of one connection)."""
    from ._client import AsyncClient  # a cycle otherwise: _client imports the package's parts

    client = AsyncClient(database_url, max_connections=1)
    try:
        await client.migrate()
    finally:
        await client.close()


def migrations() -> list[tuple[int, str, str]]:
    """Every migration this package applies, oldest first, as ``(version, description, sql)``.
    Versions are not contiguous: numbers skipped are never used."""
    return [(int(v), str(d), str(sql)) for v, d, sql in _awa.migrations()]


def migrations_range(from_version: int, to_version: int) -> list[tuple[int, str, str]]:
    """The migrations that take a schema at ``from_version`` to ``to_version``: those after
    ``from_version`` up to and including ``to_version`` (empty when ``to_version`` is not
    after ``from_version``), as in awa-pg."""
    return [(int(v), str(d), str(sql)) for v, d, sql in _awa.migrations_range(int(from_version), int(to_version))]


def current_migration_version() -> int:
    """The newest schema version this package knows (what ``migrate()`` brings a database to)."""
    return int(_awa.current_migration_version())


def schema_patches() -> list[tuple[str, str, str]]:
    """awa-pg's idempotent schema patches, ``(name, description, sql)``, to apply after the
    migrations. This package has none (every schema change is a versioned migration), so
    the list is empty; it exists so that tooling written for awa-pg runs unchanged."""
    return []
