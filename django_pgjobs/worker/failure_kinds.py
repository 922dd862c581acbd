"""What a database error tells the worker's threads to do.

A connection error means the connection (or the server) is in trouble: reconnect,
back off and repeat the same statement, dropping nothing. Any other database error
is about the data of some row: find that row rather than repeat.
"""

from __future__ import annotations

from django.db import DatabaseError, DataError, IntegrityError, InterfaceError, OperationalError

from django_pgjobs.db.readiness import sqlstate

DB_ERRORS = (OperationalError, InterfaceError, DatabaseError)
#: The connection (or server) is in trouble: reconnect, back off, repeat.
CONNECTION_ERRORS = (OperationalError, InterfaceError)
#: What a claim statement raises when one row's state breaks a constraint.
DATA_ERRORS = (IntegrityError, DataError)

#: SQLSTATEs that say "this transaction lost a race; run it again": serialization
#: failure (REPEATABLE READ, SERIALIZABLE) and deadlock. The server rolled it back.
TRANSACTION_CONFLICTS = frozenset({"40001", "40P01"})


def is_transaction_conflict(exc: BaseException) -> bool:
    """``exc`` (or the psycopg error Django wrapped in it) is a serialization failure
    or a deadlock."""
    return sqlstate(exc) in TRANSACTION_CONFLICTS
