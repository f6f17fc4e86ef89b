"""Sessions stored in a Citadel file: the only part of the package that talks to citadeldb.

Read it bottom up:

* files.py: the files that make one database; process_state.py: which process this is;
* translate.py: citadeldb's errors turned into ours (one boundary);
* engine.py: the open file and its owner thread; registry.py: the files this process
  holds open, and what a fork inherits;
* inventory.py and audit.py: what a file stores but Citadel cannot read, told apart
  from an erasure a crash interrupted, before anything is changed;
* records.py: the layout's region names and catalog records; codec.py: items to
  atoms and back;
* segments.py: sessions onto chains of small regions; reads.py and writes.py: the
  operations on one session; reembed.py: a file's vectors made anew;
* local_file.py: `LocalFile`, every operation the store offers, on a file open here.
"""
