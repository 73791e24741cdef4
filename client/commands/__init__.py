"""The ``turnstile`` command's client commands, on ``turnstile.client``: ``sessions``
(``sessions.py``), ``jobs`` (``jobs.py``), ``watchers`` (``watchers.py``) and ``memory``
(``memory.py``; ``memory backfill``, which opens the store, is the CLI's own).

``turnstile.actors.cli`` parses the command line and calls a module's ``run``, which runs the
command with ``trio.run`` against the node at ``args.url`` with the user's token. Each command
is one or two requests (``memory watch``: a subscription), so it sees and changes exactly what
that user could over HTTP. Output is a table for people, or with ``--json`` the node's answer
as it is (indented), for scripts; messages go to stderr. Exit status, as every ``turnstile``
command: 0 done; 2 the command line is wrong or the node refused the request (a 4xx: a bad
token, nothing by that id, a bad value; the node's own message is printed, with the field it
names); 1 the node could not be reached or failed (a 5xx, a timeout) (``_run.py``).
"""
