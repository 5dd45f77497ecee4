"""Tables of higher packages: migrated by the store's one mechanism, versioned per package."""

from __future__ import annotations

from pathlib import Path

import pytest

from shapewatch.collector.errors import StoreError, StoreVersionTooNew
from shapewatch.collector.store import Schema, Store

V1 = "CREATE TABLE notes (id INTEGER PRIMARY KEY, text VARCHAR NOT NULL);"
V2 = "ALTER TABLE notes ADD COLUMN author VARCHAR;"


def test_a_schema_is_created_then_migrated_keeping_rows(db_path: Path) -> None:
    with Store.open(db_path, schemas=[Schema("notes", (V1,))]) as store:
        with store.transaction("adding a note") as con:
            con.execute("INSERT INTO notes VALUES (1, 'kept')")
        assert store.query("SELECT value FROM meta WHERE key = 'schema_version.notes'") == [("1",)]
    with Store.open(db_path, schemas=[Schema("notes", (V1, V2))]) as store:
        assert store.query("SELECT id, text, author FROM notes") == [(1, "kept", None)]
        assert store.query("SELECT value FROM meta WHERE key = 'schema_version.notes'") == [("2",)]


def test_a_newer_schema_is_refused_naming_the_package(db_path: Path) -> None:
    Store.open(db_path, schemas=[Schema("notes", (V1, V2))]).close()
    with pytest.raises(StoreVersionTooNew) as err:
        Store.open(db_path, schemas=[Schema("notes", (V1,))])
    assert "notes tables" in str(err.value) and "version 2" in str(err.value)


def test_a_failed_transaction_rolls_back_and_names_what_it_did(db_path: Path) -> None:
    with Store.open(db_path, schemas=[Schema("notes", (V1,))]) as store:
        with pytest.raises(StoreError, match="adding notes"):
            with store.transaction("adding notes") as con:
                con.execute("INSERT INTO notes VALUES (1, 'a')")
                con.execute("INSERT INTO notes VALUES (1, 'duplicate key')")
        assert store.query("SELECT count(*) FROM notes") == [(0,)]
        with store.transaction("adding a note") as con:  # the lock was released
            con.execute("INSERT INTO notes VALUES (2, 'b')")
        assert store.query("SELECT id FROM notes") == [(2,)]


def test_read_only_stores_refuse_transactions(db_path: Path) -> None:
    Store.open(db_path, schemas=[Schema("notes", (V1,))]).close()
    with Store.open(db_path, read_only=True, schemas=[Schema("notes", (V1,))]) as store:
        with pytest.raises(StoreError, match="read-only"):
            with store.transaction("adding a note"):
                pass
