"""The Agents SDK's session tables, in the SDK's own statements: what an export writes.

`SQLiteSession._create_schema_for_connection` (the default table names) and
`AdvancedSQLiteSession`'s tables (branches, usage, used branch names), with the columns this
package fills of each (the others take the SDK's defaults).
"""

from __future__ import annotations

SESSIONS_TABLE, MESSAGES_TABLE = "agent_sessions", "agent_messages"

# `SQLiteSession._create_schema_for_connection`, for the default table names.
SCHEMA = (
    f"""
            CREATE TABLE IF NOT EXISTS {SESSIONS_TABLE} (
                session_id TEXT PRIMARY KEY,
                created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
                updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
            )
        """,
    f"""
            CREATE TABLE IF NOT EXISTS {MESSAGES_TABLE} (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                session_id TEXT NOT NULL,
                message_data TEXT NOT NULL,
                created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
                FOREIGN KEY (session_id) REFERENCES {SESSIONS_TABLE} (session_id)
                    ON DELETE CASCADE
            )
        """,
    f"""
            CREATE INDEX IF NOT EXISTS idx_{MESSAGES_TABLE}_session_id
            ON {MESSAGES_TABLE} (session_id, id)
        """,
)


# `AdvancedSQLiteSession._init_structure_tables`: its branches (message_structure) and usage
# (turn_usage), with the foreign keys by which it recognises the tables as its own.
STRUCTURE_SCHEMA = (
    f"""
            CREATE TABLE IF NOT EXISTS message_structure (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                session_id TEXT NOT NULL,
                message_id INTEGER NOT NULL,
                branch_id TEXT NOT NULL DEFAULT 'main',
                message_type TEXT NOT NULL,
                sequence_number INTEGER NOT NULL,
                user_turn_number INTEGER,
                branch_turn_number INTEGER,
                tool_name TEXT,
                created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
                FOREIGN KEY (session_id)
                    REFERENCES {SESSIONS_TABLE}(session_id) ON DELETE CASCADE,
                FOREIGN KEY (message_id)
                    REFERENCES {MESSAGES_TABLE}(id) ON DELETE CASCADE
            )
        """,
    f"""
            CREATE TABLE IF NOT EXISTS turn_usage (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                session_id TEXT NOT NULL,
                branch_id TEXT NOT NULL DEFAULT 'main',
                user_turn_number INTEGER NOT NULL,
                requests INTEGER DEFAULT 0,
                input_tokens INTEGER DEFAULT 0,
                output_tokens INTEGER DEFAULT 0,
                total_tokens INTEGER DEFAULT 0,
                input_tokens_details JSON,
                output_tokens_details JSON,
                created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
                FOREIGN KEY (session_id)
                    REFERENCES {SESSIONS_TABLE}(session_id) ON DELETE CASCADE,
                UNIQUE(session_id, branch_id, user_turn_number)
            )
        """,
    "CREATE INDEX IF NOT EXISTS idx_structure_session_seq ON message_structure(session_id, sequence_number)",
    "CREATE INDEX IF NOT EXISTS idx_structure_branch ON message_structure(session_id, branch_id)",
    "CREATE INDEX IF NOT EXISTS idx_structure_turn ON message_structure(session_id, branch_id, user_turn_number)",
    "CREATE INDEX IF NOT EXISTS idx_structure_branch_seq ON message_structure(session_id, branch_id, sequence_number)",
    "CREATE INDEX IF NOT EXISTS idx_turn_usage_session_turn ON turn_usage(session_id, branch_id, user_turn_number)",
    # `_ensure_branch_reservations_table` (0.24): every branch name a session used, deleted ones too.
    """
            CREATE TABLE IF NOT EXISTS branch_reservations (
                session_id TEXT NOT NULL,
                branch_id TEXT NOT NULL,
                PRIMARY KEY (session_id, branch_id)
            )
        """,
)


# The columns this package writes of each (the others take the SDK's defaults).
STRUCTURE_COLUMNS = (
    "session_id",
    "message_id",
    "branch_id",
    "message_type",
    "sequence_number",
    "user_turn_number",
    "branch_turn_number",
    "tool_name",
    "created_at",
)
USAGE_COLUMNS = (
    "session_id",
    "branch_id",
    "user_turn_number",
    "requests",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "input_tokens_details",
    "output_tokens_details",
)
RESERVATION_COLUMNS = ("session_id", "branch_id")


# This package's own table, beside the SDK's (which ignores it): each session's owner and
# labels, written only when a session has either, so an import here keeps them.
OWNERS_TABLE = "citadel_session_owners"
OWNERS_SCHEMA = f"CREATE TABLE {OWNERS_TABLE} (session_id TEXT PRIMARY KEY, owner TEXT, labels TEXT)"
