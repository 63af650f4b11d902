"""A test's incident database of either backend (SQLite, PostgreSQL), reached beside the store
under test: a statement, and a hold that keeps the store's writers waiting while readers read
(an exclusive transaction on a SQLite file in WAL mode; an EXCLUSIVE lock on PostgreSQL's
table), until its `rollback`."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

import psycopg

from watchdog.coordinator.database import SQLITE, Database

Holder = sqlite3.Connection | psycopg.Connection[Any]


def execute(database: Database, statement: str) -> list[tuple[Any, ...]]:
    """The rows `statement` returns (none for one that returns none)."""
    if database.kind == SQLITE:
        with contextlib.closing(sqlite3.connect(database.target, isolation_level=None)) as db:
            return db.execute(statement).fetchall()
    with psycopg.connect(database.target, autocommit=True) as conn:
        cursor = conn.execute(statement)
        return cursor.fetchall() if cursor.description else []


def hold_writers(database: Database) -> Holder:
    """A connection that keeps every other writer waiting until its `rollback()`."""
    if database.kind == SQLITE:
        holder = sqlite3.connect(database.target, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        return holder
    conn = psycopg.connect(database.target)  # a transaction, open until rollback()
    conn.execute("LOCK TABLE incidents IN EXCLUSIVE MODE")
    return conn
