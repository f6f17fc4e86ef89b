"""Sessions in and out of a Citadel file: the SDK's own files, JSON Lines, and any SDK session.

They stand on the store's public API; the chunks an import writes and the moves between
files, which the store itself runs on its file, are in transfer/.

* sdk_files.py: `agents.SQLiteSession` / `AdvancedSQLiteSession` files written (export);
* sdk_source.py: the same files read for an import, bounded, refused by row;
* jsonl.py: the export command's JSON Lines, one file or one per session;
* copy.py: `copy_session`, from any SDK session to any other;
* files.py: the import and export calls the operator commands make.
"""
