"""What the store runs on its file in several calls: an import's chunks, and moves between files.

* chunks.py: an import as chunks with ids derived from the items, and where a rerun resumes;
* moves.py: `move_sessions`: copy, compare item by item, then erase at the source.
"""
