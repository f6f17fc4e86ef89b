"""One file, many processes: the owner serves the file on a Unix socket, the others are its clients.

* shared_file.py: `SharedFile`, what the store stands on: own the file (and serve it) or be a
  client of the process that does; take it over when that process goes;
* served_files.py: the files this process serves; server.py: the owner's side of the socket;
* client.py: a client's side; protocol.py: what crosses the socket;
* address.py: where the socket lives, and the key a client proves it knows.
"""
